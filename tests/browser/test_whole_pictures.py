"""The page as a person sees it (issue 48), at a laptop's, a desktop's and a phone's window: every result
and history picture whole inside its box (scaled down, never cropped), the before/after slider
showing both pictures, loaded, after image-to-image, inpainting, outpainting and a hires fix, a refused request said in the
status line with the last results left in place, and an inpaint's picture and mask uploaded once.

What is measured is what is drawn: each ``<img>``'s picture (its box less what ``object-fit: contain``
leaves empty) against every box that clips it (``pages.pictures_shown``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from tests.helpers import wait_for
from tests.pages import DONE, PHONE, open_accordion, paint, pictures_shown, shot

WINDOWS = {
    "1280x900": dict(viewport={"width": 1280, "height": 900}),
    "1920x1080": dict(viewport={"width": 1920, "height": 1080}),
    "390x844": PHONE,
}


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    # Several generations a window, each with its history and slider events: over the default join rate.
    return str(launch("--rate-limit", "50", name="whole-pictures")[0])


@pytest.fixture(params=list(WINDOWS))
def window(request: pytest.FixtureRequest, browser: Any, app_url: str) -> Iterator[Any]:
    page = browser.new_page(**WINDOWS[request.param])
    page.goto(app_url)
    page.locator("#prompt textarea").wait_for(timeout=60_000)
    page.window_name = request.param
    yield page
    page.close()


def generate(page: Any, prompt: str) -> None:
    """Generate and wait for this request's picture in the history (a status line can read the same
    "done in 0.31 s" after two quick jobs)."""
    kept = page.locator("#history img").count()
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate").click()
    status = page.locator("#status")
    wait_for(lambda: page.locator("#history img").count() > kept or "Error" in status.inner_text(), "an answer", 60)
    assert page.locator("#history img").count() > kept, status.inner_text()  # this request's picture
    page.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)


def loaded(page: Any, selector: str, count: int) -> list[dict[str, Any]]:
    """The pictures under ``selector`` once ``count`` of them have loaded (a natural width)."""
    wait_for(
        lambda: sum(p["natural"][0] > 0 for p in pictures_shown(page, selector)) >= count,
        f"{count} loaded pictures in {selector}",
        timeout=30,
    )
    return pictures_shown(page, selector)


def test_every_result_and_history_picture_is_whole(window: Any) -> None:
    generate(window, "a red circle on a blue background")
    generate(window, "a yellow star on a purple background")
    (result,) = loaded(window, "#gallery img", 1)
    assert result["shown"] > 0.99, result  # the whole picture inside the gallery's box
    assert min(result["drawn"]) >= 250, result  # and large enough to look at
    open_accordion(window, "history-panel")
    history = loaded(window, "#history img", 2)
    assert all(p["shown"] > 0.99 for p in history[:2]), history
    shot(window, f"whole-pictures-{window.window_name}", full_page=False)


def test_a_result_is_whole_on_the_widest_screen_too(browser: Any, app_url: str) -> None:
    """2560 px, the widest the issue names (the other tests run at the three windows above)."""
    page = browser.new_page(viewport={"width": 2560, "height": 1440})
    try:
        page.goto(app_url)
        page.locator("#prompt textarea").wait_for(timeout=60_000)
        generate(page, "a yellow star on a purple background")
        (result,) = loaded(page, "#gallery img", 1)
        assert result["shown"] > 0.99 and min(result["drawn"]) >= 250, result
    finally:
        page.close()


@pytest.mark.parametrize("mode", ["image", "inpaint", "outpaint", "hires"])
def test_the_slider_shows_the_input_and_the_result_loaded_at_one_size(window: Any, picture: Path, mode: str) -> None:
    if mode == "hires":  # text to image with hires fix: its first pass (64 px) against the result (128 px)
        open_accordion(window, "hires")
        window.locator("#hires-fix input[type=checkbox]").check()
    elif mode in ("image", "outpaint"):
        window.locator("#mode").get_by_text(
            {"image": "Image to image", "outpaint": "Outpaint"}[mode], exact=True
        ).click()
        window.locator("#input-image input[type=file]").set_input_files(str(picture))
        window.locator("#input-image img").first.wait_for(timeout=15_000)
        if mode == "outpaint":  # the canvas grows 16 px on the right: the before is drawn where it sits on it
            right = window.locator("#outpaint-right input[type=number]")
            right.fill("16")
            right.press("Enter")
    else:  # a result sent to inpaint, and a mask as a file (white: redrawn)
        generate(window, "a red circle on a blue background")
        window.locator("#send-gallery-inpaint").click()
        wait_for(lambda: window.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
        hole = np.zeros((64, 64), np.uint8)
        hole[16:48, 16:48] = 255
        mask = picture.with_name("hole.png")
        Image.fromarray(hole).save(mask)
        with window.expect_response(lambda r: "/gradio_api/upload" in r.url, timeout=30_000):  # the mask's own upload
            window.locator("#mask-upload input[type=file]").set_input_files(str(mask))
        window.locator("#mask-upload img").first.wait_for(timeout=15_000)
    generate(window, "a green triangle on a yellow background")
    before, after = loaded(window, "#before-after img", 2)
    assert before["src"] and after["src"] and before["src"] != after["src"], (before, after)
    if mode == "hires":  # the first pass the server kept beside the result, drawn in the same box
        assert "-first-0.png" in before["src"], before
        assert (before["natural"], after["natural"]) == ([64, 64], [128, 128]), (before, after)
    else:
        size = [80, 64] if mode == "outpaint" else [64, 64]
        assert before["natural"] == after["natural"] == size, (before, after)
    assert before["drawn"] == after["drawn"] and min(after["drawn"]) >= 150, (before, after)
    # A request the handler refuses (a picture over what the cost budget leaves for uploads) leaves the slider
    # as it was, like the results: not its picture against the last result.
    window.locator("#mode").get_by_text("Image to image", exact=True).click()
    large = picture.with_name("large.png")
    Image.new("RGB", (1200, 1200), "white").save(large)
    window.locator("#input-image input[type=file]").set_input_files(str(large))
    window.locator("#input-image img").first.wait_for(timeout=15_000)
    window.locator("#prompt textarea").fill("a blue square on a white background")
    window.locator("#generate").click()
    wait_for(lambda: "cost budget" in window.locator("#status").inner_text(), "the refusal in the status", 30)
    window.wait_for_timeout(500)
    again = pictures_shown(window, "#before-after img")
    assert [p["src"] for p in again] == [before["src"], after["src"]], again


def test_a_refused_request_says_so_in_the_status_and_keeps_the_last_results(window: Any) -> None:
    generate(window, "a red circle on a blue background")
    (kept,) = loaded(window, "#gallery img", 1)
    status = window.locator("#status")
    # Refused when it joins (the validator), then by the handler (inpainting without a picture).
    for refuse, said in ((None, "prompt must not be empty"), (inpaint, "inpainting needs an image")):
        if refuse is not None:
            refuse(window)
        window.locator("#prompt textarea").fill("   " if said.startswith("prompt") else "a blue square")
        window.locator("#generate").click()
        wait_for(lambda: said in status.inner_text(), f"the status says {said!r}", timeout=30)
        assert "done" not in status.inner_text(), status.inner_text()  # no old "done in ..." beside it
        (now,) = pictures_shown(window, "#gallery img")
        assert now["src"] == kept["src"] and now["shown"] > 0.99, (now, kept)  # the last result, whole
        assert "Error" not in window.locator("#gallery").inner_text()  # nothing drawn over it


def inpaint(page: Any) -> None:
    page.locator("#mode").get_by_text("Inpaint", exact=True).click()
    page.locator("#mask-editor").wait_for(state="visible")


STOP_SEEN_JS = """() => {
  window.__t2iStopSeen = false;
  new MutationObserver(() => {
    const stop = document.querySelector("#stop");
    if (stop && !stop.disabled) {  // disabled before the click and after the end: enabled in between
      window.__t2iStopSeen = true;
    }
  }).observe(document.body, { childList: true, subtree: true, attributes: true });
}"""


def test_a_first_look_heading_hint_footer_and_a_history_folded_until_it_holds_something(
    window: Any, picture: Path
) -> None:
    heading, prompt = window.locator("#heading"), window.locator("#prompt textarea")
    assert heading.inner_text().strip() == "Text to image"
    assert prompt.input_value() == "" and (prompt.get_attribute("placeholder") or "").startswith("Describe the picture")
    assert "the CPU draws one job at a time" in window.locator("#about").inner_text()  # this app runs on the CPU
    assert window.locator("#history img").count() == 0 and not window.locator("#history").is_visible()
    # Nothing to stop, reuse or send yet: disabled until they can act.
    idle = ("#stop", "#reuse-seed", "#send-gallery-image", "#send-gallery-inpaint")
    wait_for(lambda: all(window.locator(b).is_disabled() for b in idle), "the idle buttons disabled")
    brush = window.evaluate(
        "() => gradio_config.components.find((c) => c.props.elem_id === 'mask-editor').props.brush.default_size"
    )
    assert brush == 4, brush  # a sixteenth of the model's 64 px pictures
    window.evaluate(STOP_SEEN_JS)  # a job runs for a fraction of a second: the page notes Stop enabled
    window.locator("#prompt textarea").fill("a red circle on a blue background")
    window.locator("#generate").click()
    window.locator("#history img").first.wait_for(state="attached", timeout=60_000)
    window.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)
    wait_for(lambda: window.locator("#stop").is_disabled(), "Stop disabled again once it is done")
    assert window.evaluate("() => window.__t2iStopSeen"), "Stop was never enabled while the job ran"
    assert all(window.locator(b).is_enabled() for b in idle[1:]), "a result to reuse and send"
    assert window.locator("#send-history-image").is_enabled()
    assert window.locator("#history").is_visible()
    window.locator("#mode").get_by_text("Image to image", exact=True).click()
    wait_for(lambda: heading.inner_text().strip() == "Image to image", "the heading follows the mode")
    window.locator("#input-image input[type=file]").set_input_files(str(picture))
    window.locator("#input-image img").first.wait_for(timeout=15_000)
    generate(window, "a yellow star on a purple background")
    wait_for(lambda: "Strength 0.75" in window.locator("#summary").inner_text(), "the summary's mode and strength")
    assert window.locator("#summary").inner_text().startswith("Image to image"), window.locator("#summary").inner_text()


class Uploads:
    """Every upload the page posts from now on (the network's count) with its files' names (read from the
    form the page hands to ``fetch``), and every answer 429."""

    _NAMES_JS = """() => {
      window.__t2iUploads = [];
      const send = window.fetch;
      window.fetch = (url, options) => {
        if (String(url).split('?')[0].endsWith('/gradio_api/upload') && options && options.body instanceof FormData) {
          window.__t2iUploads.push(options.body.getAll('files').map((file) => file.name));
        }
        return send(url, options);
      };
    }"""

    def __init__(self, page: Any) -> None:
        self.page, self.posted, self.refused = page, 0, 0
        page.evaluate(self._NAMES_JS)
        page.on("request", self._sent)
        page.on("response", self._answered)

    def _sent(self, request: Any) -> None:
        self.posted += request.method == "POST" and request.url.split("?")[0].endswith("/gradio_api/upload")

    def _answered(self, response: Any) -> None:
        self.refused += response.status == 429

    def names(self) -> list[list[str]]:
        return list(self.page.evaluate("() => window.__t2iUploads"))


@pytest.mark.parametrize("window", ["1280x900"], indirect=True)
def test_an_inpaint_uploads_its_picture_and_mask_once(window: Any) -> None:
    """Painting uploads nothing; Generate uploads the picture and the painted mask once each (Gradio's editor
    adds its composite), however many progress updates the run sends; the rate limit never answers. (One
    window: the uploads do not depend on its size; the phone's layout is the slider test's.)"""
    generate(window, "a red circle on a blue background")
    uploads = Uploads(window)
    window.locator("#send-gallery-inpaint").click()
    wait_for(lambda: window.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
    window.wait_for_timeout(500)
    assert uploads.posted == 1, uploads.names()  # the sent picture, once
    paint(window)
    window.wait_for_timeout(1000)
    assert uploads.posted == 1, uploads.names()  # nothing while painting
    generate(window, "a blue square on a red background")
    window.wait_for_timeout(1000)  # anything the run's last progress updates would still send
    names = [name for files in uploads.names()[1:] for name in files]
    assert uploads.posted - 1 == len(uploads.names()) - 1 <= 3, (uploads.posted, uploads.names())
    assert {"background.png", "layer_0.png"} <= set(names) and max(Counter(names).values()) == 1, names
    assert uploads.refused == 0

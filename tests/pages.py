"""Helpers for the browser tests (``tests/browser/``): Debian's chromium driven by Playwright (no browser
download). The tier's marks and its skip without chromium come from the folder (``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, wait_for
from tools.screenshot import CHROMIUM, CHROMIUM_ARGS, DONE, PHONE  # noqa: F401 (the browser tests' names)

# Screenshots are kept as test artifacts (CI can upload the folder); git ignores it.
ARTIFACTS = Path(os.environ.get("T2I_TEST_ARTIFACTS", ROOT / "test-artifacts"))
SUMMARY = "#summary [data-testid=markdown]"  # the text alone (the status tracker beside it has a timer)


def open_accordion(page: Any, elem_id: str) -> None:
    """Open the accordion ``#elem_id`` if it is closed (a closed accordion's controls are not in the page)."""
    label = page.locator(f"#{elem_id} > button.label-wrap").first
    label.wait_for(timeout=60_000)
    if "open" not in (label.get_attribute("class") or "").split():
        label.click()
    page.locator(f"#{elem_id} > button.label-wrap.open").first.wait_for(timeout=10_000)


def open_ready(page: Any, url: str, *, panels: tuple[str, ...] = ("advanced", "info-panel")) -> None:
    """Load the app, open ``panels`` and wait until its load event ran (it switches live preview on)."""
    page.goto(url)
    page.locator("#prompt textarea").wait_for(timeout=60_000)
    for panel in panels:
        open_accordion(page, panel)
    if "advanced" in panels:
        deadline = time.monotonic() + 60
        while not page.locator("#live-preview input").is_checked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert page.locator("#live-preview input").is_checked()


def shot(page: Any, name: str, *, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def set_number(page: Any, elem_id: str, value: float) -> None:
    """Type a slider's value and wait until the slider has taken it (its range input follows).

    Typed again if it has not taken it within a few seconds: on a busy 2-core machine a tab opened
    a moment ago can drop its first edit (seen once: the range stayed at the default for 20 s)."""
    box, slider = page.locator(f"#{elem_id} input[type=number]"), page.locator(f"#{elem_id} input[type=range]")
    for _ in range(2):
        box.fill(str(value))
        box.press("Enter")
        deadline = time.monotonic() + 7
        while slider.input_value() != str(value) and time.monotonic() < deadline:
            time.sleep(0.05)
        if slider.input_value() == str(value):
            return
    box.fill(str(value))
    box.press("Enter")
    wait_value(slider, str(value))


def set_steps(page: Any, n: int) -> None:
    set_number(page, "steps", n)


def set_size(page: Any, n: int) -> None:
    for side in ("width", "height"):
        set_number(page, side, n)


def wait_value(locator: Any, expected: str, timeout: float = 20.0) -> None:
    """Wait until an input shows ``expected`` (the page's events update it after a round trip)."""
    deadline = time.monotonic() + timeout
    while locator.input_value() != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert locator.input_value() == expected, (locator.input_value(), expected)


def generate(page: Any, prompt: str, *, steps: int | None = None) -> None:
    """Generate from the desktop page and wait for this request's images, summary and place in the history."""
    if steps is not None:
        set_steps(page, steps)
    summary, kept = page.locator(SUMMARY).inner_text(), page.locator("#history img").count()
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate").click()
    # The summary and the history follow the images (an event of their own, after the generation).
    wait_for(lambda: page.locator("#history img").count() > kept, f"the images of {prompt!r} in the history", 60)
    wait_for(lambda: page.locator(SUMMARY).inner_text() not in ("", summary), "the summary", timeout=30)
    page.locator("#status").get_by_text(DONE).wait_for(timeout=30_000)


# Each picture an ``<img>`` under the selector draws: its drawn rectangle (the element's box, less what
# ``object-fit: contain`` leaves empty) and the fraction of it inside every box that clips it (the
# scroll boxes and hidden overflows around it), with its natural size.
_SHOWN_JS = r"""(selector) => [...document.querySelectorAll(selector)].map((img) => {
  const r = img.getBoundingClientRect();
  const fit = getComputedStyle(img).objectFit;
  const scale = fit === 'contain' ? Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight) : null;
  const w = scale ? img.naturalWidth * scale : r.width, h = scale ? img.naturalHeight * scale : r.height;
  const x = r.x + (r.width - w) / 2, y = r.y + (r.height - h) / 2;
  let box = {left: -Infinity, top: -Infinity, right: Infinity, bottom: Infinity};
  for (let e = img.parentElement; e; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (/(auto|scroll|hidden|clip)/.test(s.overflowX + ' ' + s.overflowY)) {
      const c = e.getBoundingClientRect();
      box = {left: Math.max(box.left, c.left), top: Math.max(box.top, c.top),
             right: Math.min(box.right, c.right), bottom: Math.min(box.bottom, c.bottom)};
    }
  }
  const seenW = Math.max(0, Math.min(x + w, box.right) - Math.max(x, box.left));
  const seenH = Math.max(0, Math.min(y + h, box.bottom) - Math.max(y, box.top));
  return {src: img.getAttribute('src'), natural: [img.naturalWidth, img.naturalHeight], drawn: [w, h],
          shown: w * h > 0 ? (seenW * seenH) / (w * h) : 0};
})"""


def pictures_shown(page: Any, selector: str) -> list[dict[str, Any]]:
    """Each picture under ``selector``: ``src``, ``natural`` size, ``drawn`` size and the fraction ``shown``
    (1.0: whole; less: cropped by a box around it)."""
    return list(page.evaluate(_SHOWN_JS, selector))


def paint(page: Any) -> None:
    """A stroke across the middle of the mask editor's picture, with its brush: it starts at the centre,
    where the picture is at any window size (a stroke that starts off the picture draws nothing)."""
    editor = page.locator("#mask-editor")
    editor.get_by_role("button", name="Brush", exact=True).click()
    box = editor.locator("canvas").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    page.mouse.down()
    for x in (0.55, 0.6, 0.55, 0.5, 0.45, 0.4):
        page.mouse.move(box["x"] + box["width"] * x, y, steps=3)
    page.mouse.up()


def record(page: Any) -> dict[str, Any]:
    """The last result's info record (the JSON panel, which must be open)."""
    text = page.evaluate("() => document.querySelector('#info .json-holder, #info')?.innerText ?? ''")
    return json.loads(text[text.index("{") :]) if "{" in text else {}


def generate_here(page: Any, prompt: str) -> dict[str, Any]:
    """Generate and wait for this request's record (its own id: two quick jobs can leave the same "done in
    0.31 s" behind); the record."""
    before = record(page).get("request_id")
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate").click()
    wait_for(lambda: record(page).get("request_id") not in (None, before), "this request's record", 60)
    page.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)
    assert record(page).get("prompt") == prompt, record(page)
    return record(page)


_PIXELS_JS = """async (selector) => {
  const img = document.querySelector(selector);
  if (!img) { return null; }
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const pen = canvas.getContext('2d');
  pen.drawImage(img, 0, 0);
  return { width: canvas.width, height: canvas.height,
           rgba: Array.from(pen.getImageData(0, 0, canvas.width, canvas.height).data) };
}"""


def pixels(page: Any, selector: str) -> Any:
    """The RGB pixels of the first ``<img>`` under ``selector``, as the page loaded it (a numpy array)."""
    import numpy as np

    got = page.evaluate(_PIXELS_JS, selector)
    assert got is not None, f"no picture under {selector}"
    return np.asarray(got["rgba"], dtype=np.uint8).reshape(got["height"], got["width"], 4)[..., :3]

"""The ControlNet panel on the page (issue 51), in headless chromium, on the embedded model and its own
ControlNet: a person draws a disc on the sketch pad, sees the map the model reads, generates, and the
shape the prompt asks for is drawn where the disc is (on the left, then on the right); "Send to control"
puts a result on the pad read for its edges; a pasted parameters text restores the unit's settings and
says its map is not in the text; on a phone the panel fits the screen and works."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pipeline.default_model.control import centre_of
from tests.helpers import wait_for
from tests.pages import PHONE, generate_here, open_accordion, open_ready, pixels, shot

PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    # A test clicks faster than a person (each generation gathers the pad: three uploads).
    return str(launch("--rate-limit", "50", name="control-page")[0])


def pick_control(page: Any, name: str) -> None:
    open_accordion(page, "control-panel")
    page.locator("#control input").click()
    page.get_by_role("option", name=name, exact=True).click()
    wait_for(lambda: page.locator("#control input").input_value() == name, f"the control {name}")


def draw_disc(page: Any, x: float, y: float = 0.5) -> None:
    """One dab of the pad's white brush (a disc of a sixth of the picture's side) at ``x``, ``y`` (fractions
    of the picture, which the pad draws in the middle of its canvas at the zoom its toolbar shows)."""
    pad = page.locator("#control-pad")
    pad.scroll_into_view_if_needed()
    pad.get_by_role("button", name="Brush", exact=True).click()
    zoom = pad.get_by_text(re.compile(r"^\d+%$")).first.inner_text()
    side = 64 * int(zoom.rstrip("%")) / 100  # the picture's side on screen
    box = pad.locator("canvas").first.bounding_box()
    assert box is not None
    left, top = box["x"] + (box["width"] - side) / 2, box["y"] + (box["height"] - side) / 2
    page.mouse.move(left + x * side, top + y * side)
    page.mouse.down()
    page.mouse.up()


def shown_map(page: Any) -> np.ndarray:
    """Show the map the model reads; its pixels once the preview holds a new picture."""
    before = page.locator("#control-preview img").first.get_attribute("src") if _has_preview(page) else None
    page.locator("#control-show").click()
    wait_for(lambda: _has_preview(page) and page.locator("#control-preview img").first.get_attribute("src") != before,
             "the map's preview", 30)  # fmt: skip
    return pixels(page, "#control-preview img")


def _has_preview(page: Any) -> bool:
    return bool(page.locator("#control-preview img").count())


def white_centre(picture: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(picture.mean(axis=2) > 127)
    assert len(xs), "nothing white on the map"
    return float(xs.mean() + 0.5) / picture.shape[1], float(ys.mean() + 0.5) / picture.shape[0]


def fix_seed(page: Any, seed: int) -> None:
    if page.locator("#randomize-seed input").is_checked():
        page.locator("#randomize-seed input").uncheck()
    page.locator("#seed input").fill(str(seed))
    page.locator("#seed input").press("Enter")


def paste(page: Any, text: str) -> None:
    open_accordion(page, "paste")
    page.locator("#paste-text textarea").fill(text)
    page.locator("#paste-apply").click()


@pytest.mark.parametrize("side, x", [("left", 0.25), ("right", 0.75)])
def test_a_disc_drawn_on_the_pad_says_where_the_shape_goes(fresh: Any, side: str, x: float) -> None:
    pick_control(fresh, "shapes")
    draw_disc(fresh, x)
    drawn = white_centre(shown_map(fresh))
    assert abs(drawn[0] - x) < 0.08 and abs(drawn[1] - 0.5) < 0.08, drawn  # the map is the pad, at 64 px
    fix_seed(fresh, 3)
    info = generate_here(fresh, PROMPT)
    assert info["status"] == "done" and info["control"] == "shapes" and info["control_preprocess"] == "none", info
    found = centre_of(Image.fromarray(pixels(fresh, "#gallery img")))
    assert found is not None and abs(found[0] - drawn[0]) <= 0.25 and abs(found[1] - 0.5) <= 0.25, (side, found)
    assert (found[0] < 0.5) == (side == "left"), found
    shot(fresh, f"control-1-disc-{side}")


def test_a_control_without_a_shown_pad_needs_a_map_and_none_sends_no_pad(fresh: Any) -> None:
    """A control picked by a pasted text while the pad was never shown (its panel closed) is refused by name,
    said in the status line; with control none, a drawn pad is not sent."""
    paste(fresh, 'a red circle\nSteps: 12, Seed: 3, Size: 64x64, ControlNet 0: "Module: none, Model: shapes"')
    wait_for(lambda: "map is not in the text" in fresh.locator("#paste-notes").inner_text(), "the pasted control")
    fresh.locator("#generate").click()
    status = fresh.locator("#status")
    wait_for(
        lambda: "needs a map" in status.inner_text(), "the refusal in the status line", 30, about=status.inner_text
    )
    pick_control(fresh, "shapes")
    draw_disc(fresh, 0.3)
    pick_control(fresh, "none")
    info = generate_here(fresh, "a drawn pad, no control")
    assert info["status"] == "done" and info["control"] == "none", info


def test_send_a_result_to_control_and_read_its_edges(page: Any) -> None:
    info = generate_here(page, "a yellow star on a purple background")
    assert info["control"] == "none"
    page.locator("#send-gallery-control").click()
    wait_for(lambda: page.locator("#control input").input_value() == "shapes", "Send to control picks the control")
    checked = "() => document.querySelector('#control-preprocess input:checked')?.value"
    wait_for(lambda: page.evaluate(checked) == "canny", "a picture is read for its edges")
    edges = shown_map(page)
    white = (edges.mean(axis=2) > 127).mean()
    assert 0.01 < white < 0.5, white  # an outline: some white on black, not the picture itself
    info = generate_here(page, "a red circle on a white background")
    assert info["control"] == "shapes" and info["control_preprocess"] == "canny" and info["status"] == "done", info
    shot(page, "control-2-send-to-control")


def test_a_pasted_unit_fills_the_panel_and_says_the_map_is_not_in_it(page: Any) -> None:
    paste(page, "a red circle\nSteps: 12, Sampler: Euler, CFG scale: 4, Seed: 3, Size: 64x64, "
          'ControlNet 0: "Module: invert, Model: shapes, Weight: 0.7, Guidance Start: 0.1, Guidance End: 0.8"')  # fmt: skip
    wait_for(lambda: page.locator("#control-scale input[type=number]").input_value() == "0.7", "the weight")
    assert page.locator("#control-start input[type=number]").input_value() == "0.1"
    assert page.locator("#control-end input[type=number]").input_value() == "0.8"
    assert page.evaluate("() => document.querySelector('#control-preprocess input:checked')?.value") == "invert"
    assert "map is not in the text" in page.locator("#paste-notes").inner_text()
    assert "not its map" in page.locator("#control-note").inner_text()


def test_on_a_phone_the_panel_fits_and_draws(browser: Any, app_url: str) -> None:
    phone = browser.new_page(**PHONE)
    try:
        open_ready(phone, app_url, panels=("info-panel",))
        pick_control(phone, "shapes")
        for part in ("#control-pad", "#control-preprocess", "#control-scale", "#control-end", "#control-show"):
            phone.locator(part).scroll_into_view_if_needed()
            box = phone.locator(part).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (part, box)
        assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
        draw_disc(phone, 0.7)
        assert white_centre(shown_map(phone))[0] > 0.5
        info = generate_here(phone, PROMPT)
        assert info["control"] == "shapes" and info["status"] == "done", info
        shot(phone, "control-3-phone")
    finally:
        phone.close()

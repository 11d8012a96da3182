"""The image modes on the page (issue 38), in headless chromium: a file into image-to-image, the
before/after slider, "Send to inpaint" from the result with a mask painted in the editor, "Send to
image-to-image" from the history, outpainting, and the same on a phone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from tests.helpers import wait_for
from tests.pages import DONE, PHONE, generate_here, open_ready, paint, shot


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    # A test clicks faster than a person: each generation here is an upload, a mode change, the generation
    # and its history events, a few seconds apart; over the default 4 joins a second with 10 s of burst.
    return str(launch("--rate-limit", "50", name="image-modes-page")[0])


def mode_of(page: Any) -> str | None:
    return page.evaluate("() => document.querySelector('#mode input:checked')?.value ?? null")


def choose(page: Any, label: str, value: str) -> None:
    page.locator("#mode").get_by_text(label, exact=True).click()
    wait_for(lambda: mode_of(page) == value, f"the mode {value}")


def test_image_to_image_from_a_file_shows_before_and_after(page: Any, picture: Path) -> None:
    assert not page.locator("#input-image").is_visible() and not page.locator("#mask-editor").is_visible()
    choose(page, "Image to image", "image")
    page.locator("#input-image").wait_for(state="visible")
    assert page.locator("#strength").is_visible() and not page.locator("#mask-editor").is_visible()
    page.locator("#input-image input[type=file]").set_input_files(str(picture))
    page.locator("#input-image img").first.wait_for(timeout=15_000)
    info = generate_here(page, "a red circle from a photo")
    assert info["mode"] == "image" and info["strength"] == 0.75 and info["steps_done"] == 15, info
    wait_for(lambda: page.locator("#before-after img").count() == 2, "the before/after slider's two pictures")
    shot(page, "image-modes-1-image-to-image")


def test_send_to_inpaint_from_the_result_and_paint_the_mask(page: Any) -> None:
    page.locator("#send-gallery-inpaint").click()
    wait_for(lambda: mode_of(page) == "inpaint", "Send to inpaint picks the inpaint mode")
    page.locator("#mask-editor").wait_for(state="visible")
    assert not page.locator("#input-image").is_visible() and page.locator("#mask-blur").is_visible()
    wait_for(lambda: page.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
    paint(page)
    info = generate_here(page, "a blue square painted in")
    assert info["mode"] == "inpaint" and info["status"] == "done", info
    shot(page, "image-modes-2-inpaint")


def test_send_to_image_to_image_from_the_history(page: Any) -> None:
    choose(page, "Text to image", "text")
    page.locator("#history img").first.click()  # the newest picture (inpainted): its parameters restored
    prompt = page.locator("#prompt textarea")
    wait_for(lambda: prompt.input_value() == "a blue square painted in", "the history restores the prompt")
    page.locator("#send-history-image").click()
    wait_for(lambda: mode_of(page) == "image", "Send to image-to-image picks the mode")
    page.locator("#input-image img").first.wait_for(timeout=15_000)
    info = generate_here(page, "again from the history")
    assert info["mode"] == "image", info


def test_outpainting_grows_the_canvas(page: Any) -> None:
    choose(page, "Outpaint", "outpaint")
    page.locator("#outpaint-row").wait_for(state="visible")
    slider = page.locator("#outpaint-right input[type=number]")
    slider.fill("16")
    slider.press("Enter")
    info = generate_here(page, "a wider picture")
    assert info["mode"] == "outpaint" and info["outpaint_right"] == 16 and info["outpaint_left"] == 0, info
    box = page.locator("#gallery img").first.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert box[0] == box[1] + 16, box  # the canvas grew on the right


def test_an_uploaded_mask_instead_of_a_painted_one(page: Any, tmp_path: Path) -> None:
    """The mask as a file (white: redrawn), the editor's alternative to the brush: only its white square changes."""
    choose(page, "Inpaint", "inpaint")
    page.locator("#send-gallery-inpaint").click()  # a fresh picture in the editor
    wait_for(lambda: page.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
    hole = np.zeros((64, 64), dtype=np.uint8)
    hole[16:48, 16:48] = 255
    Image.fromarray(hole).save(tmp_path / "mask.png")
    page.locator("#mask-upload input[type=file]").set_input_files(str(tmp_path / "mask.png"))
    page.locator("#mask-upload img").first.wait_for(timeout=15_000)
    info = generate_here(page, "from an uploaded mask")
    assert info["mode"] == "inpaint" and info["status"] == "done", info


def test_straight_from_a_text_result_to_inpaint(fresh: Any) -> None:
    """No picture was ever put in the image-to-image box: the inpaint request is the editor's picture and
    mask, at join time too (the page's validator once read the empty box and refused it)."""
    info = generate_here(fresh, "a text picture first")
    assert info["mode"] == "text"
    fresh.locator("#send-gallery-inpaint").click()
    wait_for(lambda: mode_of(fresh) == "inpaint", "Send to inpaint picks the inpaint mode")
    wait_for(lambda: fresh.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
    paint(fresh)
    info = generate_here(fresh, "then inpainted")
    assert info["mode"] == "inpaint" and info["status"] == "done", info


@pytest.fixture
def phone(browser: Any, app_url: str) -> Iterator[Any]:
    page = browser.new_page(**PHONE)
    open_ready(page, app_url, panels=("info-panel",))
    yield page
    page.close()


def test_on_a_phone_image_to_image_works_and_the_result_is_in_view(phone: Any, picture: Path) -> None:
    choose(phone, "Image to image", "image")
    phone.locator("#input-image input[type=file]").set_input_files(str(picture))
    phone.locator("#input-image img").first.wait_for(timeout=15_000)
    phone.locator("#prompt textarea").fill("on a phone")
    phone.locator("#generate").click()
    phone.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)
    phone.locator("#gallery").scroll_into_view_if_needed()
    box = phone.locator("#gallery img").first.bounding_box()
    assert box is not None and box["width"] > 200, box  # full width of the 390 px screen, not a thumbnail
    shot(phone, "image-modes-3-phone")
    # Send to inpaint and a stroke with a finger-sized brush, on the phone too.
    phone.locator("#send-gallery-inpaint").scroll_into_view_if_needed()
    phone.locator("#send-gallery-inpaint").click()
    wait_for(lambda: mode_of(phone) == "inpaint", "Send to inpaint picks the mode on the phone")
    phone.locator("#mask-editor").scroll_into_view_if_needed()
    wait_for(lambda: phone.locator("#mask-editor canvas").count() >= 1, "the editor holds the sent picture")
    paint(phone)
    info = generate_here(phone, "inpainted on a phone")
    assert info["mode"] == "inpaint" and info["status"] == "done", info

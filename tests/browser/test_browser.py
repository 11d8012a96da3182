"""The UI in a real headless browser: Debian's chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import httpx
import pytest

from tests.pages import PHONE, open_ready, set_size, set_steps, shot

VIEWPORT = {"width": 1280, "height": 720}


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    # Stop needs a job of seconds (100 steps at 256 px): over the default cost budget.
    return str(launch("--max-pixel-steps", str(256 * 256 * 100), name="browser")[0])


def test_prompt_enter_generates_an_image_and_shows_the_info(page: Any, app_url: str) -> None:
    set_steps(page, 100)  # a job long enough (seconds) for the progress text to be seen
    prompt = page.locator("#prompt textarea")
    prompt.fill("a red circle on a blue background")
    prompt.press("Enter")
    page.get_by_text(re.compile(r"step \d+/100")).first.wait_for(timeout=60_000)  # per-step progress
    shot(page, "1-progress")
    page.locator("#info").get_by_text("finalize_end").wait_for(timeout=60_000)
    assert page.locator("#gallery img").first.is_visible()
    info_text = page.locator("#info").inner_text()
    assert "a red circle on a blue background" in info_text and "seed" in info_text
    page.get_by_text(re.compile(r"done in \d+\.\d\d s")).first.wait_for(timeout=10_000)
    shot(page, "2-image")
    # The image's own file, as the gallery's download button fetches it: a PNG with its parameters.
    from PIL import Image

    src = page.locator("#gallery img").first.get_attribute("src")
    data = httpx.get(src if src.startswith("http") else app_url.rstrip("/") + src, timeout=10).content
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG"
        assert image.text["parameters"].startswith("a red circle on a blue background\n")


def test_each_image_shows_its_time_and_its_seed_can_be_reused(page: Any) -> None:
    set_steps(page, 4)
    page.locator("#prompt textarea").fill("a yellow star on a purple background")
    page.locator("#generate").click()
    # Only the last output's info record carries the prompt; the page still shows the previous
    # test's "done in" and images until then.
    page.locator("#info").get_by_text("a yellow star on a purple background").first.wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"done in \d+\.\d\d s")).first.wait_for(timeout=60_000)
    caption = page.locator("#gallery").get_by_text(re.compile(r"seed \d+ · \d+\.\d\d s")).first
    caption.wait_for(timeout=10_000)
    seeds = [int(re.search(r"seed (\d+)", caption.inner_text()).group(1))]  # randomized: not 0
    page.locator("#gallery img").first.click()
    page.locator("#reuse-seed").click()
    seed_box = page.get_by_label("Seed", exact=True)
    deadline = time.monotonic() + 20
    while seed_box.input_value() != str(seeds[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seed_box.input_value() == str(seeds[0])
    assert not page.get_by_label("Randomize seed").is_checked()
    page.get_by_label("Randomize seed").check()
    shot(page, "3-reused-seed")


def test_stop_cancels_the_running_job(page: Any, app_url: str) -> None:
    def cancelled() -> float:
        return _cancelled(app_url)

    def status() -> str:
        return page.locator("#status").inner_text()

    before = cancelled()
    set_steps(page, 100)
    set_size(page, 256)  # a job of several seconds: it must outlast the held-back cancel below
    page.locator("#prompt textarea").fill("a long job")
    page.locator("#generate").click()
    page.get_by_text(re.compile(r"step \d+/100")).first.wait_for(timeout=60_000)
    # Hold the browser's /cancel back, as a loaded machine delays it (how CI once caught a
    # "stopped" written on a timer, then overwritten by the job's later progress): the job runs
    # on meanwhile, and the status must not claim "stopped" before the job has stopped.
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    page.route("**/cancel", hold)
    try:
        page.locator("#stop").click()
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)  # lets Playwright deliver the route
        assert held, "the Stop button sent no /cancel"
        page.wait_for_timeout(1_000)
        assert cancelled() == before, "the job stopped while its cancel was held back"
        assert "stopped" not in status(), status()
    finally:
        for route in held:
            route.continue_()
        page.unroute("**/cancel", hold)
    deadline = time.monotonic() + 30
    while cancelled() == before and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert cancelled() == before + 1
    page.locator("#status").get_by_text("stopped").wait_for(timeout=10_000)
    page.wait_for_timeout(1_000)  # no progress output of the stopped job comes after it
    assert "stopped" in status(), status()
    shot(page, "4-stopped")
    assert httpx.get(app_url + "health", timeout=10).json()["inference_in_progress"] is False
    # The next job runs as usual.
    set_size(page, 64)
    set_steps(page, 6)
    page.locator("#prompt textarea").fill("a green triangle on a yellow background")
    page.locator("#generate").click()
    page.get_by_text(re.compile(r"done in \d+\.\d\d s")).first.wait_for(timeout=60_000)
    assert "a green triangle on a yellow background" in page.locator("#info").inner_text()
    shot(page, "5-next-job")
    set_steps(page, 20)


def test_closing_the_tab_cancels_its_job(page: Any, app_url: str) -> None:
    other = page.context.browser.new_page()
    open_ready(other, app_url)
    before = _cancelled(app_url)
    set_steps(other, 100)
    other.locator("#prompt textarea").fill("a job nobody waits for")
    other.locator("#generate").click()
    other.get_by_text(re.compile(r"step \d+/100")).first.wait_for(timeout=60_000)
    other.close()
    deadline = time.monotonic() + 30
    while _cancelled(app_url) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cancelled(app_url) == before + 1
    assert httpx.get(app_url + "health", timeout=10).json()["inference_in_progress"] is False


def _cancelled(app_url: str) -> float:
    text = httpx.get(app_url + "metrics", timeout=10).text
    return float(re.search(r'jobs_total\{outcome="cancelled"\} (\S+)', text).group(1))


def test_generate_button_works_and_validation_errors_are_shown(page: Any) -> None:
    page.locator("#prompt textarea").fill("   ")
    page.locator("#generate").click()
    # Refused when it joins the queue (Gradio's validator=): the message is shown at the field.
    page.locator("#prompt").get_by_text("prompt must not be empty").wait_for(timeout=30_000)
    shot(page, "6-validation-error")


def test_a_phone_sized_screen_fits_and_every_control_is_labelled(app_url: str, page: Any) -> None:
    phone = page.context.browser.new_page(**PHONE)
    try:
        open_ready(phone, app_url)
        overflow = phone.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{overflow} px of horizontal scrolling on a phone"
        for control in ("#prompt textarea", "#generate", "#stop", "#gallery"):
            box = phone.locator(control).first.bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, control
        unlabelled = phone.evaluate("""() => [...document.querySelectorAll(
                'input:not([type=hidden]), textarea, select, button')]
            .filter(e => e.offsetParent !== null)
            .filter(e => !(e.getAttribute('aria-label') || (e.labels && e.labels.length)
                           || e.closest('label') || (e.innerText || '').trim() || e.getAttribute('title')))
            .map(e => e.outerHTML.slice(0, 120))""")
        assert unlabelled == [], unlabelled
        shot(phone, "7-phone")
    finally:
        phone.close()

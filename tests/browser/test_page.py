"""The page people expect from a text-to-image Space (issue 18), in headless chromium: size presets and
swap, the tab's history (restore, download all), pasted parameters, keys, the ETA while waiting behind
another job, the sampler in the PNG, labels, the phone layout, and the script that makes the README's
screenshots (``tools.screenshot``)."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.helpers import wait_for
from tests.pages import (
    DONE,
    PHONE,
    SUMMARY,
    generate,
    open_accordion,
    open_ready,
    set_number,
    set_size,
    set_steps,
    shot,
    wait_value,
)
from tools.screenshot import shoot

STATUS = "#status .t2i-status"  # the app's own status line (Gradio's tracker repeats its progress text)


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    # Escape and the ETA need jobs of seconds (up to 100 steps at 192 px): over the default cost budget.
    return str(launch("--max-pixel-steps", str(192 * 192 * 100), name="page")[0])


def checked_preset(page: Any) -> str | None:
    return page.evaluate("() => document.querySelector('#size-preset input:checked')?.value ?? null")


def test_a_preset_sets_the_size_and_swap_exchanges_width_and_height(page: Any) -> None:
    width, height = page.locator("#width input[type=number]"), page.locator("#height input[type=number]")
    assert checked_preset(page) == "64x64"  # the model's default size
    page.locator("#size-preset").get_by_text("16:9 · 112×64").click()
    wait_value(width, "112")
    wait_value(height, "64")
    page.locator("#swap").click()
    wait_value(width, "64")
    wait_value(height, "112")
    wait_for(lambda: checked_preset(page) == "64x112", "the swapped size shows its preset, 9:16")
    shot(page, "page-1-presets-swapped")
    set_number(page, "width", 120)  # an exact size of the sliders' own: no preset fits it
    wait_for(lambda: checked_preset(page) is None, "no preset checked for 120x112")
    page.locator("#size-preset").get_by_text("1:1 · 64×64").click()
    wait_value(width, "64")
    wait_value(height, "64")


def test_history_keeps_two_generations_restores_one_and_downloads_all(page: Any, app_url: str) -> None:
    generate(page, "a red circle on a blue background", steps=3)
    first_seed = re.search(r"Seed (\d+)", page.locator(SUMMARY).inner_text())
    assert first_seed, page.locator(SUMMARY).inner_text()
    summary = page.locator(SUMMARY).inner_text()
    for part in ("Size 64×64", "Steps 3", "Guidance", "Sampler", "Time"):
        assert part in summary, summary
    set_size(page, 96)
    generate(page, "a yellow star on a purple background", steps=5)
    history = page.locator("#history img")
    wait_for(lambda: history.count() == 2, "two images in the history")
    captions = page.locator("#history").inner_text()
    assert "a yellow star on a purple background" in captions and "a red circle on a blue background" in captions
    assert captions.index("yellow star") < captions.index("red circle")  # newest first
    shot(page, "page-2-history")
    # The older image, restored: its prompt, its own seed (randomize off), its size and steps.
    history.nth(1).click()
    wait_value(page.locator("#prompt textarea"), "a red circle on a blue background")
    wait_value(page.locator("#seed input"), first_seed.group(1))
    assert not page.get_by_label("Randomize seed").is_checked()
    wait_value(page.locator("#steps input[type=number]"), "3")
    wait_value(page.locator("#width input[type=number]"), "64")
    wait_value(page.locator("#height input[type=number]"), "64")
    shot(page, "page-3-restored")
    # Download all: a zip of both PNGs and their parameters, from the app's own output folder.
    page.locator("#download-all").click()
    link = page.locator("#history-zip a").first
    link.wait_for(timeout=30_000)
    href = link.get_attribute("href")
    data = httpx.get(href if href.startswith("http") else app_url.rstrip("/") + href, timeout=10).content
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        records = json.loads(archive.read("parameters.json"))
    assert len([n for n in names if n.endswith(".png")]) == 2 and "parameters.json" in names
    assert [r["prompt"] for r in records] == [
        "a yellow star on a purple background",
        "a red circle on a blue background",
    ]
    page.get_by_label("Randomize seed").check()


def test_pasted_parameters_fill_the_controls_and_say_what_was_not_applied(page: Any) -> None:
    open_accordion(page, "paste")
    text = (
        "a green triangle,\non a yellow background\nNegative prompt: blurry\n"
        "Steps: 7, Sampler: Euler a, CFG scale: 3.5, Seed: 1234, Size: 96x64, Model hash: abc123, "
        "Model: dreamshaper_8, Clip skip: 2, Hires upscale: 2"
    )
    page.locator("#paste-text textarea").fill(text)
    page.locator("#paste-apply").click()
    wait_value(page.locator("#prompt textarea"), "a green triangle,\non a yellow background")
    wait_value(page.locator("#negative-prompt textarea"), "blurry")
    wait_value(page.locator("#steps input[type=number]"), "7")
    wait_value(page.locator("#guidance input[type=number]"), "3.5")
    wait_value(page.locator("#seed input"), "1234")
    wait_value(page.locator("#width input[type=number]"), "96")
    wait_value(page.locator("#height input[type=number]"), "64")
    assert not page.get_by_label("Randomize seed").is_checked()
    wait_for(lambda: checked_preset(page) == "96x64", "the pasted size shows its preset, 3:2")
    if page.locator("#sampler").is_visible():  # the sampler choice (issue 18 §6), where the model offers one
        wait_value(page.locator("#sampler input"), "Euler a")
    notes = page.locator("#paste-notes")
    notes.get_by_text("Not used by this app: Model hash, Clip skip.").wait_for(timeout=10_000)
    assert "this app runs" in notes.inner_text()  # the model named differs
    assert "mode, hires fix" in notes.inner_text()  # "Hires upscale": text-to-image with hires fix
    shot(page, "page-4-pasted")
    # A value out of this model's range is left alone, with a note that names the field and the range.
    page.locator("#paste-text textarea").fill("a blue square\nSteps: 500, CFG scale: 99, Seed: 5, Size: 102x64")
    page.locator("#paste-apply").click()
    notes.get_by_text(re.compile(r"Steps: '500' not applied: this model takes a whole number from 1 to \d+")).wait_for(
        timeout=10_000
    )
    assert "CFG scale: '99' not applied" in notes.inner_text() and "Size: 102x64 not applied" in notes.inner_text()
    wait_value(page.locator("#seed input"), "5")
    assert page.locator("#steps input[type=number]").input_value() == "7"  # kept
    assert page.locator("#width input[type=number]").input_value() == "96"
    page.get_by_label("Randomize seed").check()
    set_size(page, 64)


def _cancelled(app_url: str) -> float:
    text = httpx.get(app_url + "metrics", timeout=10).text
    return float(re.search(r'jobs_total\{outcome="cancelled"\} (\S+)', text).group(1))


def test_enter_generates_and_escape_stops(page: Any, app_url: str) -> None:
    before = _cancelled(app_url)
    set_steps(page, 100)
    set_size(page, 192)  # a job of seconds
    prompt = page.locator("#prompt textarea")
    prompt.fill("a job stopped from the keyboard")
    prompt.press("Enter")
    page.get_by_text(re.compile(r"step \d+/100")).first.wait_for(timeout=60_000)
    prompt.press("Escape")
    wait_for(lambda: _cancelled(app_url) == before + 1, "the job cancelled by Escape", timeout=30)
    page.locator("#status").get_by_text("stopped").wait_for(timeout=10_000)
    shot(page, "page-5-escape-stopped")
    page.keyboard.press("Escape")  # nothing running: Escape does nothing
    page.wait_for_timeout(500)
    assert _cancelled(app_url) == before + 1 and "stopped" in page.locator("#status").inner_text()
    set_size(page, 64)


def record_status(page: Any) -> None:
    """Keep every text the app's status line (not Gradio's tracker beside it) shows in ``window.statusTexts``,
    a short-lived one too."""
    page.evaluate("""() => {
        window.statusTexts = [];
        const status = document.querySelector('#status');
        const keep = () => window.statusTexts.push(status.querySelector('.t2i-status')?.innerText ?? '');
        keep();
        new MutationObserver(keep).observe(status, {subtree: true, childList: true, characterData: true});
    }""")


def test_waiting_behind_another_job_shows_an_eta_then_the_time_left(browser: Any, page: Any, app_url: str) -> None:
    """Issue 18 §1 on the page: "about N s" while a request waits behind another job, "N s left" as it runs."""
    about = re.compile(r"waiting for the GPU: 1 ahead, about \d+(\.\d+)? s")
    left = re.compile(r"step \d+/100 · \d+ s left")
    set_size(page, 96)  # 100 steps: a job of about a second or more, its "N s left" on screen a while
    generate(page, "a warm-up job of the same shape", steps=100)  # measured: the ETA is known from now on
    other = browser.new_page(viewport={"width": 1280, "height": 1080})
    try:
        open_ready(other, app_url, panels=("advanced",))
        set_steps(other, 60)
        set_size(other, 160)  # a job of seconds, ahead of the page's
        other.locator("#prompt textarea").fill("a long job ahead in another tab")
        other.locator("#generate").click()
        other.locator(STATUS).get_by_text(re.compile(r"step \d+/60")).wait_for(timeout=60_000)
        record_status(page)
        page.locator("#prompt textarea").fill("a job that waits its turn")
        page.locator("#generate").click()
        page.locator(STATUS).get_by_text(about).wait_for(timeout=30_000)
        shot(page, "page-8-waiting-eta")
        page.locator(STATUS).get_by_text(DONE).wait_for(timeout=120_000)
        other.locator(STATUS).get_by_text(DONE).wait_for(timeout=30_000)  # and the job ahead is done
    finally:
        other.close()
        set_size(page, 64)
    # Every text the status line showed, in order (recorded as it changed: none missed): it waited
    # with an estimate, then ran with its time left.
    texts = page.evaluate("window.statusTexts")
    waited = [i for i, t in enumerate(texts) if about.search(t)]
    ran = [i for i, t in enumerate(texts) if left.search(t)]
    assert waited and ran and waited[0] < ran[0], texts


def test_the_chosen_sampler_reaches_the_png_metadata(page: Any, app_url: str) -> None:
    """Issue 18 §6 on the page: "Euler a" chosen in Advanced settings is named in the image's PNG."""
    open_accordion(page, "advanced")
    sampler = page.locator("#sampler")
    assert sampler.is_visible(), "the default model offers no sampler choice"
    sampler.locator("input").click()
    page.get_by_role("option", name="Euler a", exact=True).click()
    wait_value(sampler.locator("input"), "Euler a")
    try:
        generate(page, "a blue square on a white background", steps=4)
        src = page.locator("#gallery img").first.get_attribute("src")
        assert src, "no image in the result gallery"
        response = httpx.get(src if src.startswith("http") else app_url.rstrip("/") + src, timeout=10)
        response.raise_for_status()
        image = Image.open(io.BytesIO(response.content))
        assert image.format == "PNG", image.format
        assert "Sampler: Euler a," in image.text["parameters"], image.text["parameters"]
        generation = json.loads(image.text["generation"])
        assert generation["scheduler"] == "Euler a", generation
        assert generation["prompt"] == "a blue square on a white background", generation
        assert "Sampler Euler a" in page.locator(SUMMARY).inner_text(), page.locator(SUMMARY).inner_text()
    finally:
        sampler.locator("input").click()
        page.get_by_role("option", name=re.compile(r"^default")).click()
        wait_for(lambda: sampler.locator("input").input_value().startswith("default"), "the default sampler again")


def test_every_control_has_a_label(page: Any) -> None:
    for panel in ("advanced", "paste", "info-panel", "history-panel"):
        open_accordion(page, panel)
    for role, name in [
        ("textbox", "Prompt"),
        ("textbox", "Negative prompt"),
        ("button", "Generate"),
        ("button", "Stop"),
        ("button", "⇄ Swap"),
        ("button", "Download all (zip)"),
        ("checkbox", "Randomize seed"),
        ("checkbox", "Live preview"),
        ("radio", "16:9 · 112×64"),
        ("slider", "Width"),
        ("slider", "Height"),
        ("slider", "Steps"),
        ("slider", "Guidance scale"),
        ("slider", "Number of images"),
        ("spinbutton", "Seed"),
        ("textbox", "Parameters text (AUTOMATIC1111 format, as in this app's PNGs)"),
    ]:
        assert page.get_by_role(role, name=re.compile(re.escape(name))).first.is_visible(), (role, name)
    # Every visible control has a name of its own: its aria-label, its label's text, its own text or
    # title; not empty, and not the component's name Gradio falls back to for an empty label.
    unlabelled = page.evaluate("""() => {
        const generic = new Set(['textbox', 'number', 'slider', 'checkbox', 'dropdown', 'radio', 'gallery', 'button']);
        const name = (e) => {
            const by = (e.getAttribute('aria-labelledby') || '').split(' ').map(id => document.getElementById(id));
            return [e.getAttribute('aria-label'), ...by.map(x => x && x.textContent),
                    ...[...(e.labels || [])].map(l => l.textContent), e.closest('label')?.textContent,
                    e.innerText, e.getAttribute('title')].map(t => (t || '').trim()).find(t => t) || '';
        };
        return [...document.querySelectorAll(
                'input:not([type=hidden]), textarea, select, button, [role=listbox], [role=slider]')]
            .filter(e => e.offsetParent !== null)
            .filter(e => !name(e) || generic.has(name(e).toLowerCase()))
            .map(e => e.outerHTML.slice(0, 120));
    }""")
    assert unlabelled == [], unlabelled


def test_on_a_phone_the_result_is_in_view_after_generate(browser: Any, app_url: str) -> None:
    phone = browser.new_page(**PHONE)
    try:
        open_ready(phone, app_url, panels=())  # as a person finds it: settings folded
        phone.locator("#prompt textarea").fill("a red circle on a blue background")
        phone.locator("#generate").click()  # Playwright scrolls the button into view first if it must
        clicked_at = phone.evaluate("window.scrollY")
        phone.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)
        image = phone.locator("#gallery img").first
        image.wait_for(timeout=10_000)
        assert phone.evaluate("window.scrollY") == clicked_at  # the result moved nothing
        box = image.bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= 844, box  # in view, without scrolling
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        assert box["height"] >= 200, box  # and large
        stop = phone.locator("#stop").bounding_box()
        prompt = phone.locator("#prompt textarea").bounding_box()
        assert stop and prompt and stop["y"] < prompt["y"] + prompt["height"], "Stop wrapped below the prompt"
        shot(phone, "page-6-phone-result", full_page=False)
    finally:
        phone.close()


def test_the_readme_screenshots_come_from_the_page(browser: Any, app_url: str, tmp_path: Path) -> None:
    """``tools.screenshot`` (``python -m tools.screenshot`` writes the README's ``docs/screenshot.png`` and
    ``docs/screenshot-phone.png``) runs on this app: each shot once its pictures have loaded."""
    paths = shoot(app_url, tmp_path, browser)
    assert Image.open(paths["desktop"]).size == (1280, 1180)
    assert Image.open(paths["phone"]).size == (780, 1688)  # 390 x 844 at twice the pixels

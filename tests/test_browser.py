"""The UI in a real headless browser: Debian's chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (.ci/run installs it)"),
]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import app
    from pipeline.config import load_settings

    tmp = tmp_path_factory.mktemp("browser")
    saved = dict(os.environ)
    os.environ.update(GRADIO_TEMP_DIR=str(tmp / "gradio"), HF_HUB_OFFLINE="1")
    port = free_port()
    settings = load_settings(["--port", str(port), "--output-dir", str(tmp / "outputs")], environ={})
    demo, adapter = app.create_app(settings)
    app.launch(demo, settings, block=False)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
        adapter.worker.shutdown(timeout=10)
        adapter.close()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def page(app_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(app_url)
        yield page
        browser.close()


def test_prompt_enter_generates_an_image_and_shows_the_info(page: Any, tmp_path: Path) -> None:
    prompt = page.locator("#prompt textarea")
    prompt.fill("a red circle on a blue background")
    prompt.press("Enter")
    image = page.locator("#gallery img").first
    image.wait_for(state="visible", timeout=60_000)
    page.locator("#info").get_by_text("request_id").wait_for(timeout=30_000)
    info_text = page.locator("#info").inner_text()
    assert "a red circle on a blue background" in info_text and "seed" in info_text
    page.screenshot(path=str(tmp_path / "ui.png"))


def test_generate_button_works_and_validation_errors_are_shown(page: Any) -> None:
    page.locator("#prompt textarea").fill("   ")
    page.locator("#generate").click()
    page.get_by_text("prompt must not be empty").first.wait_for(timeout=30_000)

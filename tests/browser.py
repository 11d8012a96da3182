"""Helpers for the browser tests: Debian's chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_MARKS = [
    pytest.mark.server,
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (.ci/run installs it)"),
]
ROOT = Path(__file__).resolve().parent.parent
# Screenshots are kept as test artifacts (CI can upload the folder); git ignores it.
ARTIFACTS = Path(os.environ.get("T2I_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = dict(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True)


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
    """Type a slider's value and wait until the slider has taken it (its range input follows)."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    wait_value(page.locator(f"#{elem_id} input[type=range]"), str(value))


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

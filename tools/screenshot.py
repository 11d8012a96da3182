"""The README's pictures, made from the real page so they stay true (issue 48):

    python -m tools.screenshot [--url URL] [--out docs]

Starts the app on its embedded model (unless ``--url`` names a running one), drives Debian's
chromium with Playwright (``executable_path``: no browser download) the way a person does, and
writes two PNGs:

- ``screenshot.png``: the desktop page (1280 px wide) after a picture sent to image-to-image: the
  result whole in its box, the before/after slider under it with both pictures, the summary;
- ``screenshot-phone.png``: a phone (390 × 844) after Generate: the result in view under the prompt.

Each shot waits until its pictures have loaded; ``shoot`` returns the paths (a browser test runs it
against its own app, into a temporary folder).
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = dict(viewport={"width": 1280, "height": 1180})
PHONE = dict(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True)
DONE = re.compile(r"done in \d+\.\d\d s")
LOADED_JS = "(selector) => [...document.querySelectorAll(selector)].filter((img) => img.naturalWidth > 0).length"


def _generate(page: Any, prompt: str) -> None:
    """Generate and wait for this request's picture in the tab's history."""
    kept = page.locator("#history img").count()
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate").click()
    deadline = time.monotonic() + 120
    while page.locator("#history img").count() <= kept:
        if time.monotonic() > deadline or "Error" in page.locator("#status").inner_text():
            raise RuntimeError(f"no picture for {prompt!r}: {page.locator('#status').inner_text()}")
        page.wait_for_timeout(100)
    page.locator("#status").get_by_text(DONE).wait_for(timeout=60_000)


def _loaded(page: Any, selector: str, count: int) -> None:
    page.wait_for_function(f"() => ({LOADED_JS})({selector!r}) >= {count}", timeout=30_000)


def shoot(url: str, out: Path, browser: Any = None) -> dict[str, Path]:
    """The two screenshots of the page at ``url``, written into ``out``, with ``browser`` (a Playwright
    chromium: a test's own) or one of its own."""
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            own = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                return shoot(url, out, own)
            finally:
                own.close()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"desktop": out / "screenshot.png", "phone": out / "screenshot-phone.png"}
    desktop, phone = browser.new_page(**DESKTOP), browser.new_page(**PHONE)
    try:
        desktop.goto(url)
        desktop.locator("#prompt textarea").wait_for(timeout=60_000)
        _generate(desktop, "a large orange circle in the center on a green background")
        desktop.locator("#send-gallery-image").click()
        desktop.locator("#input-image img").first.wait_for(timeout=15_000)
        _generate(desktop, "a large yellow star in the center on a purple background")
        _loaded(desktop, "#gallery img", 1)
        _loaded(desktop, "#before-after img", 2)
        desktop.mouse.move(0, 0)  # no hover marks
        desktop.evaluate("() => window.scrollTo(0, 0)")
        desktop.screenshot(path=str(paths["desktop"]), full_page=False)
        phone.goto(url)
        phone.locator("#prompt textarea").wait_for(timeout=60_000)
        _generate(phone, "a red circle on a blue background")
        _loaded(phone, "#gallery img", 1)
        phone.evaluate("() => window.scrollTo(0, 0)")
        phone.screenshot(path=str(paths["phone"]), full_page=False)
    finally:
        desktop.close()
        phone.close()
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(outputs: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The app on its embedded model, on a free local port, once it answers."""
    port = _free_port()
    app = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--output-dir", str(outputs)], cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return app, url
        except OSError:
            if app.poll() is not None or time.monotonic() > deadline:
                app.kill()
                raise SystemExit(f"the app did not start on {url}") from None
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running app (default: start one on the embedded model)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    if args.url:
        paths = shoot(args.url, args.out)
    else:
        with tempfile.TemporaryDirectory() as outputs:
            app, url = _serve(Path(outputs))
            try:
                paths = shoot(url, args.out)
            finally:
                app.terminate()
                app.wait(timeout=30)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()

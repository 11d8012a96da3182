"""The browser tier's fixtures: one Debian chromium per module, driven by Playwright (no browser download),
and the module's page on its app (``app_url``, which each module launches with its own flags).

A module's page is 1280 x 1080 unless the module sets ``VIEWPORT``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.pages import CHROMIUM, CHROMIUM_ARGS, open_ready


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 64 px picture of seeded noise, for the image modes' inputs."""
    import numpy as np
    from PIL import Image

    path = tmp_path_factory.mktemp("pictures") / "photo.png"
    rng = np.random.default_rng(4)
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def page(request: pytest.FixtureRequest, browser: Any, app_url: str) -> Iterator[Any]:
    """The desktop page, loaded with its panels open and ready (``pages.open_ready``)."""
    page = browser.new_page(viewport=getattr(request.module, "VIEWPORT", {"width": 1280, "height": 1080}))
    open_ready(page, app_url)
    yield page
    page.close()


@pytest.fixture
def fresh(browser: Any, app_url: str) -> Iterator[Any]:
    """A desktop page of its own for one test (loaded and ready like ``page``), closed after it."""
    page = browser.new_page(viewport={"width": 1280, "height": 1080})
    open_ready(page, app_url)
    yield page
    page.close()

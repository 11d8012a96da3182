"""The LoRA controls on the page, in Debian's chromium: the dropdown ("none" and the loaded names), the scale
slider that moves to an adapter's suggested scale when it is picked, the adapter named in the summary and
in the PNG, and Paste parameters selecting the adapter of a ``<lora:NAME:SCALE>`` tag."""

from __future__ import annotations

import io
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.helpers import wait_for
from tests.loras import loras_of
from tests.pages import SUMMARY, generate, open_accordion, shot, wait_value

VIEWPORT = {"width": 1280, "height": 1600}


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    loras = loras_of("default")
    return str(launch("--lora", f"ink={loras['a']}", "--lora", f"glow={loras['b']}:0.6", name="lora-page")[0])


def pick(page: Any, name: str) -> None:
    box = page.locator("#lora input")
    box.click()
    page.get_by_role("option", name=name, exact=True).click()
    wait_value(box, name)


def test_picking_an_adapter_moves_the_scale_and_the_image_names_it(page: Any, app_url: str) -> None:
    lora = page.locator("#lora")
    assert lora.is_visible()
    lora.locator("input").click()
    options = [o.inner_text().replace("✓", "").strip() for o in page.get_by_role("option").all()]
    assert options == ["none", "ink", "glow"], options
    page.get_by_role("option", name="glow", exact=True).click()
    wait_value(lora.locator("input"), "glow")
    wait_value(page.locator("#lora-scale input[type=number]"), "0.6")  # glow's suggested scale
    generate(page, "a red circle on a blue background", steps=3)
    shot(page, "lora-1-glow")
    assert "LoRA glow × 0.6" in page.locator(SUMMARY).inner_text()
    src = page.locator("#gallery img").first.get_attribute("src")
    data = httpx.get(src if src.startswith("http") else app_url.rstrip("/") + src, timeout=10).content
    with Image.open(io.BytesIO(data)) as image:
        assert image.text["parameters"].startswith("a red circle on a blue background <lora:glow:0.6>\n")
        assert 'Lora hashes: "glow: ' in image.text["parameters"]


def test_paste_selects_the_adapter_of_the_tag(page: Any) -> None:
    pick(page, "none")
    open_accordion(page, "paste")
    page.locator("#paste-text textarea").fill(
        "a green triangle <lora:ink:0.8>\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: 9, Size: 64x64"
    )
    page.locator("#paste-apply").click()
    wait_value(page.locator("#lora input"), "ink")
    wait_value(page.locator("#lora-scale input[type=number]"), "0.8")
    wait_for(lambda: page.locator("#prompt textarea").input_value() == "a green triangle", "the prompt without its tag")
    assert "LoRA" in page.locator("#paste-notes").inner_text()  # "Filled: ..., LoRA."

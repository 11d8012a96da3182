"""The page's model picker (issue 52), in headless chromium, on a server of two models: the embedded model
(64 px, 20 steps, guidance 4) and a tiny SD 1.5 build (512 px, 50 steps, guidance 7.5). Picking the second
moves the size, steps and guidance to its own; a generation runs on it (its record and PNG text say so); a
pasted parameters text naming the first sets the picker back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.families import built_family
from tests.helpers import wait_for
from tests.pages import generate_here, open_accordion, set_size, set_steps, wait_value


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    tiny = str(built_family("sd1"))
    return str(launch("--model", "embedded-default", "--model", f"tiny={tiny}", "--rate-limit", "50",
                      name="picker-page")[0])  # fmt: skip


def pick_model(page: Any, label: str, name: str) -> None:
    page.locator("#model input").click()
    page.get_by_role("option", name=label, exact=True).click()
    wait_for(lambda: page.locator("#model input").input_value() == label, f"the model {name}")


def test_a_picked_model_brings_its_own_settings_and_draws(page: Any) -> None:
    assert page.locator("#model").is_visible()
    wait_value(page.locator("#width input[type=number]"), "64")
    pick_model(page, "tiny · sd", "tiny")
    wait_value(page.locator("#width input[type=number]"), "512")  # its own default size
    wait_value(page.locator("#steps input[type=number]"), "50")
    wait_value(page.locator("#guidance input[type=number]"), "7.5")
    open_accordion(page, "control-panel")  # the embedded model's own ControlNet is not the tiny build's
    page.locator("#control input").click()
    page.get_by_role("option", name="none", exact=True).wait_for()  # the list is open: what a person sees
    shown = [text.replace("✓", "").strip() for text in page.get_by_role("option").all_inner_texts()]
    assert shown == ["none"], shown  # (the chosen one carries a tick)
    page.keyboard.press("Escape")
    set_size(page, 64)
    set_steps(page, 4)
    record = generate_here(page, "a red circle on a blue background")
    assert record["model"] == "tiny" and record["num_inference_steps"] == 4 and record["guidance_scale"] == 7.5
    # a text made on the other model sets the picker back (and its settings are read against that model)
    open_accordion(page, "paste")
    page.locator("#paste-text textarea").fill(
        "a blue square\nSteps: 12, Sampler: Euler, CFG scale: 3, Seed: 5, Size: 64x64, Model: embedded-default"
    )
    page.locator("#paste-apply").click()
    wait_for(lambda: page.locator("#model input").input_value() == "embedded-default · sd", "the pasted model")
    wait_value(page.locator("#steps input[type=number]"), "12")
    assert generate_here(page, "a blue square")["model"] == "embedded-default"

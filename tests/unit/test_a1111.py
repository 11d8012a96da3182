"""Pasted AUTOMATIC1111 parameters: parsed as A1111 parses them, applied within this model's limits."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.request import MAX_SEED, Limits
from pipeline.serving.postprocess import a1111_parameters, quote
from pipeline.web.apis.a1111 import fill_from, match_sampler, notes_html, parse_parameters, settings_pairs
from tests.fakes import FAKE_PROFILE
from tests.helpers import ROOT

LIMITS = Limits.for_model(FAKE_PROFILE)  # sizes: multiples of 8 from 64 to 512; steps 1-50; guidance 0-20
SAMPLERS = ["default (Euler)", "Euler", "Euler a", "DPM++ 2M Karras", "DDIM", "UniPC"]

# Written by AUTOMATIC1111 itself (v1.9+: the schedule type on its own; hires fix; quoted values).
A1111_NEW = """masterpiece, best quality, a lighthouse on a cliff,
(stormy sky:1.2), dramatic light
Negative prompt: (worst quality, low quality:1.4), blurry,
watermark
Steps: 28, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 3456789012, Size: 512x768, \
Model hash: 7f96a1a9ca, Model: dreamshaper_8, Denoising strength: 0.5, Clip skip: 2, Hires upscale: 2, \
Hires upscaler: Latent, Lora hashes: "add_detail: 7c6bad76eb54, more_details: 3b8aa1d351ef", Version: v1.9.4"""
# Before v1.9 the schedule was part of the sampler's name; no negative prompt.
A1111_OLD = """a cat wearing a hat
Steps: 20, Sampler: DPM++ 2M Karras, CFG scale: 7, Seed: 1234, Size: 384x256, Model hash: 6ce0161689, \
Model: v1-5-pruned-emaonly, ENSD: 31337, Version: v1.6.0"""


def test_a1111s_own_text_is_split_the_way_a1111_splits_it() -> None:
    pasted = parse_parameters(A1111_NEW)
    assert pasted.prompt == "masterpiece, best quality, a lighthouse on a cliff,\n(stormy sky:1.2), dramatic light"
    assert pasted.negative_prompt == "(worst quality, low quality:1.4), blurry,\nwatermark"
    assert pasted.settings["Size"] == "512x768" and pasted.settings["Schedule type"] == "Karras"
    # A quoted value keeps its commas.
    assert pasted.settings["Lora hashes"] == "add_detail: 7c6bad76eb54, more_details: 3b8aa1d351ef"
    assert list(pasted.settings)[-1] == "Version"


def test_what_fits_is_filled_and_each_field_that_does_not_gets_a_note() -> None:
    fill = fill_from(parse_parameters(A1111_NEW), LIMITS, samplers=SAMPLERS, model="fake-model")
    assert fill.values == {
        "prompt": "masterpiece, best quality, a lighthouse on a cliff,\n(stormy sky:1.2), dramatic light",
        "negative_prompt": "(worst quality, low quality:1.4), blurry,\nwatermark",
        "num_inference_steps": 28,
        "guidance_scale": 6.5,
        "seed": 3456789012,
        "randomize_seed": False,
        "scheduler": "DPM++ 2M Karras",  # "DPM++ 2M" + "Schedule type: Karras"
        # "Hires upscale": text-to-image with hires fix; its "Denoising strength" is the second pass's
        "mode": "text",
        "hires_fix": True,
        "hires_scale": 2.0,
        "hires_steps": 0,
        "hires_strength": 0.5,
    }
    notes = "\n".join(fill.notes)
    assert "Size: 512x768 not applied: this model takes multiples of 8 from 64 to 512" in notes
    assert "Model: the text names 'dreamshaper_8'; this app runs 'fake-model'" in notes
    assert "Not used by this app: Model hash, Clip skip, Lora hashes, Version." in notes
    assert "Hires upscaler: 'Latent' not applied: this app upscales with Lanczos" in notes
    shown = notes_html(fill)
    assert shown.startswith(
        '<div class="t2i-notes"><p><strong>Filled:</strong> prompt, negative prompt, steps, '
        "guidance, seed, sampler, mode, hires fix.</p><ul>"
    )
    assert "<li>Size: 512x768 not applied" in shown


def test_the_older_format_and_a_text_without_a_negative_prompt() -> None:
    fill = fill_from(parse_parameters(A1111_OLD), LIMITS, samplers=SAMPLERS)
    assert fill.values["prompt"] == "a cat wearing a hat"
    assert fill.values["negative_prompt"] == ""  # made without one: the box is emptied
    assert fill.values["scheduler"] == "DPM++ 2M Karras"
    assert (fill.values["width"], fill.values["height"]) == (384, 256)
    assert fill.notes == ["Not used by this app: Model hash, ENSD, Version."]  # no model name given to compare


def test_this_apps_own_text_round_trips() -> None:
    params = {
        "prompt": "a red circle\non a blue background",
        "negative_prompt": "blurry, dark",
        "num_inference_steps": 12,
        "guidance_scale": 7.5,
        "width": 96,
        "height": 64,
    }
    for sampler in ("Euler a", "DPM++ 2M Karras", "EulerDiscreteScheduler"):  # a name, or the model's own class
        text = a1111_parameters(params, 4242, "fake-model", sampler)
        fill = fill_from(parse_parameters(text), LIMITS, samplers=SAMPLERS, model="fake-model")
        assert fill.notes == [], fill.notes
        assert fill.values == {
            **params,
            "prompt": "a red circle on a blue background",  # one line: a line break is written as a space
            "seed": 4242,
            "randomize_seed": False,
            "scheduler": "Euler" if sampler == "EulerDiscreteScheduler" else sampler,
            "mode": "text",
            "hires_fix": False,
        }
    text = a1111_parameters({**params, "negative_prompt": ""}, 1, "m", "DDIM")
    no_negative = fill_from(parse_parameters(text), LIMITS)
    assert no_negative.values["negative_prompt"] == ""


@pytest.mark.parametrize(
    ("line", "note"),
    [
        ("Steps: 150", "Steps: '150' not applied: this model takes a whole number from 1 to 50."),
        ("Steps: many", "Steps: 'many' not applied"),
        ("Steps: 2.5", "Steps: '2.5' not applied"),
        ("CFG scale: 31", "CFG scale: '31' not applied: this model takes 0 to 20."),
        ("CFG scale: nan", "CFG scale: 'nan' not applied"),
        ("Seed: -1", f"Seed: '-1' not applied: a seed is a whole number from 0 to {MAX_SEED}."),
        ("Seed: 99999999999", "Seed: '99999999999' not applied"),
        ("Size: 100x64", "Size: 100x64 not applied: this model takes multiples of 8 from 64 to 512"),
        ("Size: 512x512", None),
        ("Size: huge", "Size: 'huge' not applied: expected WIDTHxHEIGHT"),
        ("Sampler: Heun", "Sampler: 'Heun' not applied: this model offers default (Euler), Euler, Euler a,"),
        ("Sampler: LMS, Schedule type: Karras", "Sampler: 'LMS (Karras)' not applied"),
    ],
)
def test_a_value_this_model_cannot_take_is_left_out_with_a_note(line: str, note: str | None) -> None:
    key = line.split(":")[0]
    filler = ", ".join(f"{k}: 1" for k in ("Steps", "Seed", "CFG scale") if k != key)
    fill = fill_from(parse_parameters(f"a prompt\n{line}, {filler}"), LIMITS, samplers=SAMPLERS)
    if note is None:
        assert fill.notes == [] and fill.values["width"] == 512
        return
    assert any(n.startswith(note) for n in fill.notes), fill.notes
    field = {
        "Steps": "num_inference_steps",
        "CFG scale": "guidance_scale",
        "Seed": "seed",
        "Size": "width",
        "Sampler": "scheduler",
    }[key]
    assert field not in fill.values and fill.values["prompt"] == "a prompt"


def test_the_sampler_is_matched_whatever_its_spelling_and_only_where_the_page_offers_one() -> None:
    assert match_sampler("dpm++ 2m karras", SAMPLERS) == "DPM++ 2M Karras"
    assert match_sampler("Euler", ["default (Euler)"]) == "default (Euler)"  # the model's own
    assert match_sampler("Euler (flow match)", ["default (Euler (flow match))"]) == "default (Euler (flow match))"
    assert match_sampler("Euler a", ["default (Euler)"]) is None
    text = "a prompt\nSteps: 4, Sampler: Euler a, CFG scale: 7, Seed: 1"
    no_choice = fill_from(parse_parameters(text), LIMITS).notes
    assert "Sampler: 'Euler a' not applied: this page has no sampler choice." in no_choice


def test_texts_that_are_not_whole_parameters() -> None:
    assert fill_from(parse_parameters("   "), LIMITS).notes[0].startswith("Nothing to apply")
    only_prompt = fill_from(parse_parameters("just a prompt: with a colon, and commas"), LIMITS)
    assert only_prompt.values == {"prompt": "just a prompt: with a colon, and commas", "negative_prompt": ""}
    assert only_prompt.notes[0].startswith("No settings line")
    crlf = parse_parameters("a\r\nNegative prompt: b\r\nSteps: 3, CFG scale: 2, Seed: 5")
    assert (crlf.prompt, crlf.negative_prompt, crlf.settings["Seed"]) == ("a", "b", "5")
    no_prompt = fill_from(parse_parameters("Steps: 3, CFG scale: 2, Seed: 5"), LIMITS)
    assert "prompt" not in no_prompt.values and no_prompt.values["seed"] == 5
    assert no_prompt.notes[0].startswith("Prompt: the text has none")


def test_a_negative_prompt_a_model_cannot_use_and_an_over_long_prompt_are_refused() -> None:
    flux = Limits.for_model(dataclasses.replace(FAKE_PROFILE, supports_negative_prompt=False), max_prompt_chars=20)
    fill = fill_from(parse_parameters("x" * 21 + "\nNegative prompt: blurry\nSteps: 3, CFG scale: 2, Seed: 5"), flux)
    assert "prompt" not in fill.values and "negative_prompt" not in fill.values
    assert fill.notes[:2] == [
        "Prompt not applied: it is 21 characters; this app takes at most 20.",
        "Negative prompt not applied: this model does not use one.",
    ]


def test_a_prompts_line_breaks_cannot_plant_lines_and_quoted_values_round_trip() -> None:
    planted = "a cat\nNegative prompt: planted\nSteps: 99, Sampler: Heun, CFG scale: 1, Seed: 5, Size: 64x64"
    params = {
        "prompt": planted,
        "negative_prompt": "blurry,\r\nSteps: 1, Seed: 2, Size: 8x8",
        "num_inference_steps": 12,
        "guidance_scale": 7.5,
        "width": 96,
        "height": 64,
    }
    model = 'C:\\models\\odd, "quoted": name'
    text = a1111_parameters(params, 4242, model, "Euler a")
    assert len(text.splitlines()) == 3, text  # prompt, negative prompt, settings: nothing more
    pasted = parse_parameters(text)
    assert pasted.prompt == " ".join(planted.splitlines())
    assert pasted.negative_prompt == "blurry, Steps: 1, Seed: 2, Size: 8x8"
    assert pasted.settings["Model"] == model and pasted.settings["Seed"] == "4242"
    assert pasted.settings["Steps"] == "12" and pasted.settings["Sampler"] == "Euler a"
    assert text.splitlines()[-1].endswith("Model: " + json.dumps(model) + ", RNG: CPU")  # A1111's quote: JSON


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.from_regex(r"[A-Za-z][A-Za-z0-9 ]{0,12}", fullmatch=True), st.text(max_size=30)),
        min_size=1,
        max_size=6,
    )
)
def test_every_quoted_settings_line_reads_back_as_written(pairs: list[tuple[str, str]]) -> None:
    pairs = [(k.strip(), v.strip()) for k, v in pairs if k.strip()]
    line = ", ".join(f"{k}: {quote(v)}" for k, v in pairs)
    assert settings_pairs(line) == pairs


def test_the_notes_are_plain_text() -> None:
    fill = fill_from(
        parse_parameters("a\nSteps: ![x](https://evil.example/t.png), Seed: <b>1</b>, CFG scale: 2"), LIMITS
    )
    shown = notes_html(fill)
    assert "<b>" not in shown and "&lt;b&gt;" in shown and "<img" not in shown


@pytest.mark.parametrize(
    "shape", ['"x" * 1_000_000', '"a," * 500_000 + ":"', "'k: \"' * 250_000", '"k: v, " * 170_000']
)
def test_the_parser_reads_a_megabyte_of_its_worst_cases_in_one_pass(shape: str) -> None:
    """Linear, not quadratic: a megabyte in about a second at most (A1111's regular expression: 16k
    characters took 1.8 s, so a megabyte would take hours). Far from the bound, not a timing test.
    In a process of its own: a regular expression holds the GIL, and a thread could not be given up on."""
    import subprocess
    import sys

    code = f"from pipeline.web.apis.a1111 import parse_parameters; parse_parameters({shape})"
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the parser is not linear in its input")


def test_the_noise_source_is_written_as_a1111_writes_it_and_another_source_gets_a_note() -> None:
    """Issue 36 §8: the noise comes from a CPU generator on every device: ``RNG: CPU`` in the parameters."""
    params = {"prompt": "a cat", "num_inference_steps": 4, "guidance_scale": 7.5, "width": 64, "height": 64}
    text = a1111_parameters(params, 7, "m", "EulerDiscreteScheduler")
    assert text.splitlines()[-1].endswith(", RNG: CPU")
    limits = Limits.for_model(FAKE_PROFILE)
    assert not [n for n in fill_from(parse_parameters(text), limits).notes if "RNG" in n]
    gpu = fill_from(parse_parameters(text.replace("RNG: CPU", "RNG: GPU")), limits)
    assert any("RNG: the text's noise came from 'GPU'" in n for n in gpu.notes), gpu.notes


def test_each_modes_text_pastes_back_into_its_mode() -> None:
    """The PNG's AUTOMATIC1111 fields of an image mode and of hires fix bring the page back to them."""
    base = {"prompt": "a red circle", "negative_prompt": "", "num_inference_steps": 12, "guidance_scale": 7.5,
            "width": 64, "height": 64}  # fmt: skip
    cases = [
        ({"mode": "image", "strength": 0.6}, {"mode": "image", "strength": 0.6, "hires_fix": False}),
        ({"mode": "inpaint", "strength": 0.8, "mask_blur": 6},
         {"mode": "inpaint", "strength": 0.8, "mask_blur": 6, "hires_fix": False}),
        ({"mode": "text", "hires_fix": True, "hires_scale": 1.5, "hires_strength": 0.4, "hires_steps": 9},
         {"mode": "text", "hires_fix": True, "hires_scale": 1.5, "hires_strength": 0.4, "hires_steps": 9}),
    ]  # fmt: skip
    for extra, expected in cases:
        text = a1111_parameters({**base, **extra}, 1, "fake-model", "Euler")
        fill = fill_from(parse_parameters(text), LIMITS, samplers=SAMPLERS, model="fake-model")
        assert fill.notes == [], (text, fill.notes)
        assert {k: fill.values[k] for k in expected} == expected, text
    no_modes = Limits.for_model(dataclasses.replace(FAKE_PROFILE, modes=("text",)))
    text = a1111_parameters({**base, "mode": "image", "strength": 0.6}, 1, "fake-model", "Euler")
    fill = fill_from(parse_parameters(text), no_modes, samplers=SAMPLERS)
    assert "mode" not in fill.values and any("serves no image mode" in n for n in fill.notes)


def test_a1111_requests_take_numeric_strings_sampler_aliases_and_name_the_field_sent() -> None:
    """Issue 49: as A1111's pydantic models take them: ``seed: "-1"`` (random), ``steps: "4"``; its
    sampler aliases (``k_euler_a``); an error about ``sampler_index`` names ``sampler_index``."""
    from pipeline.errors import InvalidRequest
    from pipeline.web.apis.sdapi_fields import a1111_raw

    limits = dataclasses.replace(LIMITS, samplers=("default", "Euler", "Euler a", "DPM++ 2M Karras"))
    raw, _ = a1111_raw({"prompt": "x", "seed": "-1", "steps": "4", "sampler_name": "k_euler_a"}, FAKE_PROFILE,
                       limits, img2img=False)  # fmt: skip
    assert raw["randomize_seed"] and raw["num_inference_steps"] == 4 and raw["scheduler"] == "Euler a"
    raw, _ = a1111_raw({"prompt": "x", "seed": "12", "sampler_index": "k_dpmpp_2m_ka"}, FAKE_PROFILE, limits,
                       img2img=False)  # fmt: skip
    assert raw["seed"] == 12 and not raw["randomize_seed"] and raw["scheduler"] == "DPM++ 2M Karras"
    with pytest.raises(InvalidRequest) as refused:
        a1111_raw({"prompt": "x", "sampler_index": "Heun"}, FAKE_PROFILE, limits, img2img=False)
    assert refused.value.field == "sampler_index" and str(refused.value).startswith("sampler_index must be one of")
    with pytest.raises(InvalidRequest) as refused:
        a1111_raw({"prompt": "x", "seed": "one"}, FAKE_PROFILE, limits, img2img=False)
    assert refused.value.field == "seed"

"""The table of request fields (``pipeline.fields``, issue 47): what is derived from it matches it, and
the one set of number parsers names the field and the range in every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import fields
from pipeline.errors import InvalidRequest
from pipeline.request import FIELDS, PICTURE_DEFAULTS
from pipeline.web.apis.sdapi_fields import A1111_NAME
from pipeline.web.page.handler import DOC, SIGNATURE


def test_the_handlers_signature_and_docstring_are_the_tables() -> None:
    names = list(SIGNATURE.parameters)
    assert names[: len(fields.TABLE)] == list(FIELDS) == [f.name for f in fields.TABLE]
    assert names[len(fields.TABLE) :] == ["progress", "request", "profile"]  # what Gradio injects
    for f in fields.TABLE:
        param = SIGNATURE.parameters[f.name]
        assert param.default == f.default and param.annotation == f.type, f.name
        assert f"    {f.name}: {f.doc.splitlines()[0]}" in DOC, f.name
    assert tuple(fields.signature([]).parameters) == FIELDS
    assert {k: v for k, v in fields.defaults().items() if k in PICTURE_DEFAULTS} == PICTURE_DEFAULTS


def test_the_wire_formats_read_the_tables_names() -> None:
    assert fields.a1111_names() == A1111_NAME
    assert A1111_NAME["guidance_scale"] == "cfg_scale" and A1111_NAME["num_inference_steps"] == "steps"
    assert A1111_NAME["image"] == "init_images" and "width" not in A1111_NAME  # the same name: not listed
    assert {"num_inference_steps", "guidance_scale", "scheduler", "lora", "lora_scale"} <= set(
        fields.passed_through("openai")
    )


@pytest.mark.parametrize(
    ("kwargs", "value", "expected"),
    [
        ({"whole": True, "lo": 1, "hi": 50}, 7.0, 7),
        ({"lo": 0.0, "hi": 1.0, "above": True}, 1, 1.0),
        ({"whole": True, "text": True}, "12", 12),  # a form field's text
        ({"text": True}, " 2.5 ", 2.5),
    ],
)
def test_the_number_parser_takes_what_each_format_sends(kwargs: dict[str, Any], value: Any, expected: Any) -> None:
    got = fields.number("x", value, **kwargs)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("kwargs", "value", "message"),
    [
        ({"whole": True, "lo": 1, "hi": 50}, 7.5, "steps must be a whole number between 1 and 50; got 7.5"),
        ({"whole": True, "lo": 1, "hi": 50}, 51, "steps must be a whole number between 1 and 50; got 51"),
        ({"lo": 0.0, "hi": 1.0, "above": True}, 0, "steps must be a number above 0 and at most 1; got 0"),
        ({}, float("nan"), "steps must be a number; got nan"),
        ({}, True, "steps must be a number; got True"),
        ({}, "12", "steps must be a number; got &#x27;12&#x27;"),  # text only where the format sends text
        ({"text": True}, "1" * 41, "steps must be a number; got"),  # no 5,000-digit numerals
        ({"whole": True, "text": True}, "1e400", "steps must be a whole number; got"),
    ],
)
def test_the_number_parser_names_the_field_and_the_range(kwargs: dict[str, Any], value: Any, message: str) -> None:
    with pytest.raises(InvalidRequest, match=".") as refused:
        fields.number("steps", value, **kwargs)
    assert str(refused.value).startswith(message) and refused.value.field == "steps"


def test_a_choice_names_its_choices() -> None:
    assert fields.choice("mode", "text", ("text", "image")) == "text"
    with pytest.raises(InvalidRequest, match=r"mode must be one of 'text', 'image'; got &#x27;x&#x27;"):
        fields.choice("mode", "x", ("text", "image"))


def test_a_table_field_is_checked_carried_written_and_read_back() -> None:
    """``step_cache``, the first table field (issue 47): checked by its row, carried to the model side,
    written to the PNG text only away from its default, read back from a paste."""
    from pipeline.request import Limits, validate
    from pipeline.web.apis.a1111 import fill_from, parse_parameters
    from tests.helpers import raw_request

    limits = Limits(64, 512, 8, 512 * 512, 1, 50, 0.0, 20.0, 4, 2000, (("clip", 77),))
    request = validate(raw_request(step_cache="off"), limits)
    options = {"step_cache": "off", "emphasis": "default", "control": "none", "control_scale": 1.0,
               "control_start": 0.0, "control_end": 1.0, "control_preprocess": "none", "model": ""}  # fmt: skip
    assert dict(request.options) == options and dict(request.to_job().options) == options
    assert request.parameters()["step_cache"] == "off"
    refusal = "step_cache must be one of 'off', 'auto', 'default'; got &#x27;fast&#x27;"  # this model: no loops
    with pytest.raises(InvalidRequest, match=refusal) as refused:
        validate(raw_request(step_cache="fast"), limits)
    assert refused.value.field == "step_cache"
    assert fields.png_settings({"step_cache": "off"}) == {}  # at its default: not written
    pasted = fill_from(parse_parameters("a circle\nSteps: 4, Seed: 1, Step cache: off"), limits)
    assert pasted.values["step_cache"] == "off"
    refused_paste = fill_from(parse_parameters("a circle\nSteps: 4, Seed: 1, Step cache: fast"), limits)
    assert "step_cache" not in refused_paste.values and any("Step cache" in n for n in refused_paste.notes)


def test_step_cache_resolves_default_and_auto_and_refuses_what_the_model_cannot_run() -> None:
    """Issue 50: "default" is the server's ``--step-cache``, "auto" the model's first method ("off" where it
    offers none); a method is refused by name where the request runs as one pipeline call (inpainting,
    hires fix where the loop runs text only), while "auto" and the default are "off" there; the PNG text names a method, never "off"."""
    import dataclasses

    from pipeline.request import Limits, validate
    from tests.fakes import FAKE_PROFILE
    from tests.helpers import raw_request

    looped = dataclasses.replace(FAKE_PROFILE, step_caches=fields.STEP_CACHE_METHODS, modes=("text", "image"))
    limits = Limits.for_model(looped, step_cache="auto")

    def method(**raw: Any) -> str:
        return str(dict(validate(raw_request(**raw), limits).options)["step_cache"])

    assert method() == method(step_cache="default") == method(step_cache="auto") == "taylorseer"
    assert method(step_cache="reuse") == "reuse" and method(step_cache="off") == "off"
    assert dict(validate(raw_request(), Limits.for_model(looped)).options)["step_cache"] == "off"  # server: off
    assert dict(validate(raw_request(step_cache="auto"), Limits.for_model(FAKE_PROFILE)).options)["step_cache"] == "off"
    with pytest.raises(InvalidRequest, match="step_cache must be one of 'off', 'auto', 'taylorseer', 'reuse'"):
        method(step_cache="teacache")
    hires = dict(hires_fix=True, width=64, height=64)
    assert method(**hires) == "off"  # its loop runs text only (FLUX.1's): off where it cannot run
    with pytest.raises(InvalidRequest, match="step_cache 'reuse' runs in step-level loops .* hires fix") as refused:
        method(step_cache="reuse", **hires)
    assert refused.value.field == "step_cache"
    limits = Limits.for_model(dataclasses.replace(looped, loop_modes=("text", "image")), step_cache="auto")
    assert method(**hires) == "taylorseer" and method(step_cache="reuse", **hires) == "reuse"  # both passes loop
    assert fields.png_settings({"step_cache": "taylorseer"}) == {"Step cache": "taylorseer"}
    assert fields.png_settings({"step_cache": "off"}) == {}


def test_emphasis_is_a_table_field_the_server_default_and_the_family_read() -> None:
    """Issue 49: ``emphasis`` checked by its row (A1111's names), the family's own kept as "default"
    (not written to the PNG text), another written as ``Emphasis:`` and read back from a paste;
    ``--prompt-syntax plain`` makes "default" "None"; a family that takes no weights gets the text
    with the syntax removed, a weighing family (SD) the text as written (its model side parses it)."""
    import dataclasses

    from pipeline.request import Limits, validate
    from pipeline.web.apis.a1111 import fill_from, parse_parameters
    from tests.fakes import FAKE_PROFILE
    from tests.helpers import raw_request

    sd = Limits.for_model(FAKE_PROFILE)
    assert dict(validate(raw_request(emphasis="Original"), sd).options)["emphasis"] == "default"  # SD's own
    no_norm = validate(raw_request(emphasis="No norm", prompt="a (red:1.2) circle"), sd)
    assert dict(no_norm.options)["emphasis"] == "No norm" and no_norm.to_job().prompts == ("a (red:1.2) circle",)
    assert fields.png_settings(no_norm.parameters()) == {"Emphasis": "No norm", "Model": "fake-model"}
    assert fields.png_settings(validate(raw_request(), sd).parameters()) == {"Model": "fake-model"}  # always written
    with pytest.raises(InvalidRequest, match="emphasis must be one of") as refused:
        validate(raw_request(emphasis="original"), sd)
    assert refused.value.field == "emphasis"
    pasted = fill_from(parse_parameters("a (red:1.2) circle\nSteps: 4, Seed: 1, Emphasis: No norm"), sd)
    assert pasted.values["emphasis"] == "No norm" and pasted.values["prompt"] == "a (red:1.2) circle"
    plain_server = dataclasses.replace(sd, prompt_syntax="plain")
    assert dict(validate(raw_request(), plain_server).options)["emphasis"] == "None"
    pixart = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="pixart"))  # T5 alone: no weights
    job = validate(raw_request(prompt="a (red:1.5) circle BREAK [blue]", negative_prompt="((ugly))",
                               guidance_scale=5.0), pixart).to_job()  # fmt: skip
    assert job.prompts == ("a red circle blue",) and job.negative_prompts == ("ugly",)
    flux = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="flux"))  # T5 weighted on the model side
    assert validate(raw_request(prompt="a (red:1.5) circle"), flux).to_job().prompts == ("a (red:1.5) circle",)
    as_written = validate(raw_request(prompt="a (red:1.5) circle", emphasis="None"), pixart).to_job()
    assert as_written.prompts == ("a (red:1.5) circle",)

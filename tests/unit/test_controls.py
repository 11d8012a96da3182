"""ControlNet's request side (issue 51), without a model: ``--controlnet`` specs, the control fields and
their cross-field rules, and the map an upload becomes (``pipeline.controls``)."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipeline import controls, fields
from pipeline.errors import InvalidRequest
from pipeline.request import Limits, validate, with_pictures
from tests.fakes import FAKE_PROFILE
from tests.helpers import raw_request

LIMITS = Limits.for_model(dataclasses.replace(FAKE_PROFILE, controls=("shapes",), modes=("text", "image", "inpaint"),
                                              control_modes=("text", "image", "inpaint")))  # fmt: skip


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def disc(cx: int = 20, size: int = 64) -> Image.Image:
    image = Image.new("RGB", (size, size), "black")
    ImageDraw.Draw(image).ellipse([cx - 10, 22, cx + 10, 42], fill="white")
    return image


def test_a_controlnet_spec_names_what_is_wrong() -> None:
    assert controls.ControlSpec.parse("shapes=assets/default-controlnet") == controls.ControlSpec(
        "shapes", "assets/default-controlnet"
    )
    for bad, words in (("shapes", "NAME=PATH_OR_HUB_ID"), ("none=x/y", "not 'none'"), ("-a=x", "letters")):
        with pytest.raises(ValueError, match=words):
            controls.ControlSpec.parse(bad)
    with pytest.raises(ValueError, match="given twice"):
        controls.parse_all(["a=x", "A=y"])


def test_the_control_fields_refuse_each_bad_value_by_name_with_the_range() -> None:
    base = dict(control="shapes", control_image=png(disc()))
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"control": "canny-sd15"}, "control", "control must be one of 'none', 'shapes'"),
        ({"control_scale": 2.5}, "control_scale", "between 0 and 2"),
        ({"control_start": -0.1}, "control_start", "between 0 and 1"),
        ({"control_start": 0.6, "control_end": 0.4}, "control_end", r"at least control_start \(0.6\)"),
        ({"control_preprocess": "depth"}, "control_preprocess", "'none', 'canny', 'invert'"),
        ({"control_image": None}, "control_image", "needs a map"),
        ({"control": "none"}, "control_image", "no ControlNet is picked"),
    ]
    for over, field, words in cases:
        with pytest.raises(InvalidRequest, match=words) as refused:
            validate(raw_request(**{**base, **over}), LIMITS)
        assert refused.value.field == field, (over, refused.value)
    outpaint = dict(mode="outpaint", image=png(disc()), outpaint_left=16)
    with pytest.raises(InvalidRequest, match="acts in text, image, inpaint modes") as refused:
        validate(raw_request(**base, **outpaint), LIMITS)
    assert refused.value.field == "control"
    assert dict(validate(raw_request(), LIMITS).options)["control"] == "none"  # the default: no control


def test_a_map_goes_through_the_upload_checks_and_reaches_the_job_at_its_size() -> None:
    raw = raw_request(control="shapes", control_image=png(disc(size=128)), control_scale=0.7, control_end=0.5)
    request = with_pictures(validate(raw, LIMITS, pictures_later=True), raw, LIMITS)
    job = request.to_job()
    assert len(job.controls) == job.num_images and job.controls[0].size == (job.width, job.height)
    assert dict(job.options)["control_scale"] == 0.7 and dict(job.options)["control_end"] == 0.5
    assert request.parameters()["control"] == "shapes"  # the info record names it
    with pytest.raises(InvalidRequest, match="control_image: not a PNG, JPEG or WebP") as refused:
        bad = raw_request(control="shapes", control_image=b"GIF89a....")
        with_pictures(validate(bad, LIMITS, pictures_later=True), bad, LIMITS)
    assert refused.value.field == "control_image"


def test_the_preprocessors_make_the_map_the_model_reads() -> None:
    square = Image.new("RGB", (64, 64), "black")
    ImageDraw.Draw(square).rectangle([16, 16, 47, 47], fill=(200, 60, 60))
    edges = np.asarray(controls.control_map(square, "canny", 64, 64).convert("L")) > 0
    assert edges[16:48, 15:18].any() and edges[16:48, 46:49].any()  # its left and right sides
    assert not edges[24:40, 24:40].any() and not edges[:8].any()  # nothing inside it or far outside
    sketch = Image.new("RGB", (32, 32), "white")
    ImageDraw.Draw(sketch).ellipse([8, 8, 24, 24], fill="black")
    inverted = np.asarray(controls.control_map(sketch, "invert", 64, 64))
    assert inverted[32, 32].min() > 200 and inverted[2, 2].max() < 50  # light disc on black, resized to 64
    assert controls.control_map(disc(), "none", 64, 64).tobytes() == disc().tobytes()
    assert fields.CONTROL_PREPROCESSORS == controls.PREPROCESSORS


def test_the_png_text_carries_the_unit_as_automatic1111_writes_it_and_a_paste_restores_it() -> None:
    from pipeline.serving.postprocess import a1111_parameters
    from pipeline.web.apis.a1111 import fill_from, parse_parameters

    raw = raw_request(control="shapes", control_image=png(disc()), control_scale=0.8, control_end=0.75,
                      control_preprocess="invert")  # fmt: skip
    params = with_pictures(validate(raw, LIMITS, pictures_later=True), raw, LIMITS).parameters()
    text = a1111_parameters(params, 1, "fake-model", "EulerDiscreteScheduler")
    unit = 'ControlNet 0: "Module: invert, Model: shapes, Weight: 0.8, Guidance Start: 0, Guidance End: 0.75"'
    assert unit in text.splitlines()[-1]
    assert "ControlNet" not in a1111_parameters(validate(raw_request(), LIMITS).parameters(), 1, "m", "DDIM")
    filled = fill_from(parse_parameters(text), LIMITS)
    names = ("control", "control_scale", "control_start", "control_end", "control_preprocess")
    expected = ("shapes", 0.8, 0.0, 0.75, "invert")
    assert tuple(filled.values[k] for k in names) == expected
    assert any("its map is not in the text" in note for note in filled.notes)
    other = fill_from(parse_parameters(text.replace("Model: shapes", "Model: depth_sd15")), LIMITS)
    assert "control" not in other.values and any("Model 'depth_sd15' not applied" in n for n in other.notes)


def test_a_step_cache_named_for_a_control_the_loops_do_not_run_is_refused_by_name() -> None:
    """Where the model's loops run no ControlNet, a request with one is one pipeline call: a named step
    cache is refused by name, "auto" runs off; where they run one per member, it is kept."""
    cached = dataclasses.replace(LIMITS, step_caches=("taylorseer",), loop_modes=("text",))
    base = dict(control="shapes", control_image=png(disc()))
    with pytest.raises(InvalidRequest, match="this model's loops run no ControlNet") as refused:
        validate(raw_request(**base, step_cache="taylorseer"), cached)
    assert refused.value.field == "step_cache"
    assert dict(validate(raw_request(**base, step_cache="auto"), cached).options)["step_cache"] == "off"
    assert dict(validate(raw_request(step_cache="taylorseer"), cached).options)["step_cache"] == "taylorseer"
    looped = dataclasses.replace(cached, loop_modes=("text", "control"))
    assert dict(validate(raw_request(**base, step_cache="taylorseer"), looped).options)["step_cache"] == "taylorseer"


def test_a_control_in_a_mode_its_family_has_no_controlnet_pipeline_for_is_refused_by_name() -> None:
    """``ModelProfile.control_modes``: the modes diffusers has the family's ControlNet pipeline for (found at
    load); a control in another mode, or with a hires fix (its second pass is image to image) where image
    to image has none, is refused by name before any work, saying where it acts."""
    text_only = dataclasses.replace(LIMITS, control_modes=("text",))
    base = dict(control="shapes", control_image=png(disc()))
    cases = [dict(mode="image", image=png(disc())), dict(hires_fix=True)]
    for over in cases:
        with pytest.raises(InvalidRequest, match="a ControlNet acts in text here") as refused:
            validate(raw_request(**base, **over), text_only)
        assert refused.value.field == "control", over
        validate(raw_request(**base, **over), LIMITS)  # where the family has the pipelines

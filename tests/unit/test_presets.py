"""Size presets: every one on the model's size grid, within its limits, at its nominal aspect."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.protocol import ModelProfile
from pipeline.request import Limits
from pipeline.web.page.presets import ASPECT_TOLERANCE, RATIOS, parse_value, preset_value, size_presets
from tests.fakes import FAKE_PROFILE

EMBEDDED = dataclasses.replace(FAKE_PROFILE, min_size=64, max_size=256)  # the embedded model's 64 px grid
SD15 = dataclasses.replace(FAKE_PROFILE, default_width=512, default_height=512, max_size=1024)
SDXL = dataclasses.replace(FAKE_PROFILE, default_width=1024, default_height=1024, max_size=2048)
FLUX = dataclasses.replace(SDXL, size_multiple=16)
CASES: dict[str, tuple[ModelProfile, Limits]] = {
    "embedded 64 px": (EMBEDDED, Limits.for_model(EMBEDDED)),
    "SD 1.5": (SD15, Limits.for_model(SD15)),
    "SDXL": (SDXL, Limits.for_model(SDXL)),
    "FLUX, step 16": (FLUX, Limits.for_model(FLUX)),
    "SDXL, --max-size 1024": (SDXL, Limits.for_model(SDXL, max_size=1024)),
    "SDXL, --max-pixels 512x512": (SDXL, Limits.for_model(SDXL, max_pixels=512 * 512)),
    "step 64": (SD15, Limits.for_model(dataclasses.replace(SD15, size_multiple=64, max_size=512))),
}


@pytest.mark.parametrize("name", CASES)
def test_every_preset_is_on_the_grid_within_the_limits_and_near_its_aspect(name: str) -> None:
    p, limits = CASES[name]
    presets = size_presets(p.default_width, p.default_height, limits)
    ratios = [f"{w}:{h}" for w, h in RATIOS]
    assert [preset.ratio for preset in presets][: len(RATIOS)] == ratios
    assert all(preset.ratio == "1:1" for preset in presets[len(RATIOS) :])  # the larger squares
    for preset in presets:
        w, h = preset.width, preset.height
        assert w % limits.size_multiple == 0 and h % limits.size_multiple == 0, preset
        assert limits.min_size <= w <= limits.max_size and limits.min_size <= h <= limits.max_size, preset
        assert w * h <= limits.max_pixels, preset
        nominal_w, nominal_h = map(int, preset.ratio.split(":"))
        assert abs((w / h) / (nominal_w / nominal_h) - 1) <= ASPECT_TOLERANCE, preset
        assert preset.label == f"{preset.ratio} · {w}×{h}" and parse_value(preset.value) == (w, h)
    by_ratio = {preset.ratio: (preset.width, preset.height) for preset in presets[: len(RATIOS)]}
    for landscape, portrait in (("4:3", "3:4"), ("3:2", "2:3"), ("16:9", "9:16")):
        assert by_ratio[portrait] == by_ratio[landscape][::-1]  # turned, not computed apart


def test_presets_keep_about_the_default_pixel_count() -> None:
    for name in ("embedded 64 px", "SD 1.5", "SDXL", "FLUX, step 16"):
        p, limits = CASES[name]
        presets = size_presets(p.default_width, p.default_height, limits)[: len(RATIOS)]
        assert presets[0].value == f"{p.default_width}x{p.default_height}"
        target = p.default_width * p.default_height
        for preset in presets:  # the embedded model's minimum size (64) makes its 16:9 larger
            assert 0.75 <= preset.width * preset.height / target <= 1.8, (name, preset)
    sd = {x.ratio: x.value for x in size_presets(512, 512, CASES["SD 1.5"][1])}
    assert sd["16:9"] == "680x384" and sd["3:2"] == "624x416"


def test_the_larger_squares_follow_the_models_size_range() -> None:
    def squares(case: str) -> list[str]:
        p, limits = CASES[case]
        return [x.value for x in size_presets(p.default_width, p.default_height, limits)[len(RATIOS) :]]

    assert squares("embedded 64 px") == ["128x128", "256x256"]  # up to the embedded model's 256 px
    assert squares("SD 1.5") == ["1024x1024"] and squares("SDXL") == ["2048x2048"]
    assert squares("SDXL, --max-size 1024") == [] and squares("SDXL, --max-pixels 512x512") == []


def test_narrowed_limits_narrow_the_presets() -> None:
    capped = {x.ratio: (x.width, x.height) for x in size_presets(1024, 1024, CASES["SDXL, --max-size 1024"][1])}
    assert capped["1:1"] == (1024, 1024) and capped["16:9"] == (1024, 576)
    few = {x.ratio: x.width * x.height for x in size_presets(1024, 1024, CASES["SDXL, --max-pixels 512x512"][1])}
    assert few["1:1"] == 512 * 512 and all(n <= 512 * 512 for n in few.values())


def test_a_ratio_the_grid_cannot_draw_is_left_out() -> None:
    one_size = Limits.for_model(dataclasses.replace(FAKE_PROFILE, min_size=64, max_size=64))
    assert [x.value for x in size_presets(64, 64, one_size)] == ["64x64"]


def test_preset_value_names_the_preset_of_a_size_or_none() -> None:
    presets = size_presets(64, 64, CASES["embedded 64 px"][1])
    assert preset_value(presets, 112, 64) == "112x64"
    assert preset_value(presets, 112.0, 64.0) == "112x64"  # sliders send floats
    assert preset_value(presets, 120, 64) is None
    assert parse_value("nonsense") is None and parse_value(None) is None and parse_value("64x") is None

"""Previews in half precision (issue 36 §2): the preview map of a VAE that overflows float16 is fitted in
float32, so an SDXL in float16 has previews, and they are the ones float32 shows; previews that are
off say so and why (the start log, /health, the page)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from pipeline.config import Settings
from tests.fakes import FAKE_PROFILE, FakeModel
from tests.half import hot_sdxl
from tests.helpers import raw_request


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    path = hot_sdxl()
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def previews_of(model: Any) -> list[np.ndarray]:
    from pipeline.engine.hosting.runner import NEVER
    from pipeline.request import Limits, validate

    job = validate(
        raw_request(live_preview=True, num_inference_steps=8, width=64, height=64), Limits.for_model(model.profile)
    ).to_job()
    shown: list[np.ndarray] = []

    def on_step(step: int, total: int, previews: Any) -> None:
        shown.extend(np.asarray(image.convert("RGB"), dtype=float) for image in dict(previews or {}).values())

    model.generate(job, NEVER, on_step)
    return shown


def test_an_sdxl_vae_that_overflows_float16_still_has_previews_the_same_as_in_float32(folder: Path) -> None:
    from pipeline.engine.model.loading import load_model

    half = load_model(Settings(model=str(folder), dtype="float16", device="cpu"), warmup=False)
    full = load_model(Settings(model=str(folder), dtype="float32", device="cpu"), warmup=False)
    assert half.pipe.vae.dtype.itemsize == 2 and half.profile.previews and half.profile.preview_note == ""
    assert half.preview_map is not None and half.preview_map.finite
    (w16, b16), (w32, b32) = half.preview_map.layers[0], full.preview_map.layers[0]
    # The same map, but for the VAE's weights rounded to float16 and back (about 0.2 % here):
    assert float((w16 - w32).abs().max()) < 1e-2 and float((b16 - b32).abs().max()) < 1e-2
    shown16, shown32 = previews_of(half), previews_of(full)
    assert len(shown16) == len(shown32) >= 6, (len(shown16), len(shown32))
    diffs = [float(np.abs(a - b).mean()) for a, b in zip(shown16, shown32)]
    assert max(diffs) < 4.0, diffs  # of 255: the float16 denoiser's rounding, nothing more


def test_previews_that_are_off_say_why_at_start_in_health_and_on_the_page(
    make_adapter: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, folder: Path
) -> None:
    import pipeline.engine.model.previews as previews
    from pipeline.engine.model.loading import load_model

    def cannot(vae: Any) -> Any:
        raise RuntimeError("this VAE cannot encode")

    monkeypatch.setattr(previews, "fit_from_vae", cannot)
    with caplog.at_level("WARNING"):
        model = load_model(Settings(model=str(folder), device="cpu"), warmup=False)
    note = model.profile.preview_note
    assert not model.profile.previews and model.preview_map is None and "RuntimeError" in note
    assert any("live previews are off" in r.getMessage() and note in r.getMessage() for r in caplog.records)
    off = FakeModel(profile=dataclasses.replace(FAKE_PROFILE, previews=False, preview_note=note))
    adapter, _ = make_adapter(off)
    assert adapter.health()["previews"] == f"off: {note}"
    from pipeline.web.page.layout import build_demo

    demo = build_demo(adapter, Settings())
    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "live-preview")
    assert box.interactive is False and note in (box.info or "")

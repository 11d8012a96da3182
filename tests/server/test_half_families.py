"""Half precision in the family matrix (issue 36 §7): in bfloat16 on the CPU, for SD, SDXL, FLUX and
Z-Image, the app's call gives the pixels of a plain diffusers call, a step-level loop gives exactly
``pipe()``'s pixels, and a member that joined a running loop stays within 1/255 of its picture alone."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import Settings
from pipeline.protocol import InferenceJob, InferenceResult
from tests.families import built_family, plain_diffusers_images
from tests.helpers import run_loop

_MODELS: dict[str, Any] = {}


def model_of(name: str) -> Any:
    from pipeline.engine.model.loading import load_model

    if name not in _MODELS:
        source = None if name == "default" else str(built_family(name))
        _MODELS[name] = load_model(Settings(model=source, dtype="bfloat16", device="cpu"), warmup=False)
    return _MODELS[name]


def mad(a: tuple[Image.Image, ...], b: tuple[Image.Image, ...]) -> float:
    """Mean |difference| in levels of 255."""
    return float(np.mean([np.abs(np.asarray(x, float) - np.asarray(y, float)).mean() for x, y in zip(a, b)]))


def job(
    rid: str, prompts: tuple[str, ...], seeds: tuple[int, ...], steps: int, guidance: float, size: int
) -> InferenceJob:
    return InferenceJob(rid, prompts, ("",) * len(prompts), seeds, size, size, steps, guidance, joinable=True)


@pytest.mark.parametrize("name", ["sd1", "sdxl", "flux-dev", "z-image"])
def test_in_bfloat16_the_pixels_of_a_plain_diffusers_call(name: str) -> None:
    model = model_of(name)
    assert model.pipe.dtype == torch.bfloat16
    size = max(64, model.profile.size_multiple * 4)
    guidance = min(4.0, model.profile.max_guidance)
    ours = model.generate(job("p", ("a red circle",), (5,), 2, guidance, size), threading.Event(), lambda *_: None)
    plain = plain_diffusers_images(name, size, 2, guidance, 5, torch.bfloat16)
    assert mad(ours.images, tuple(plain)) <= 1.0, mad(ours.images, tuple(plain))


def images_of(ended: dict[str, Any]) -> dict[str, Any]:
    assert all(isinstance(e, InferenceResult) for e in ended.values()), ended
    return {rid: e.images for rid, e in ended.items()}


@pytest.mark.parametrize("name", ["default", "flux-dev", "z-image"])
def test_in_bfloat16_a_loop_equals_pipe_and_a_joiner_stays_within_1_of_255(name: str) -> None:
    model = model_of(name)
    size = max(64, model.profile.size_multiple * 4)
    guidance = min(3.5, model.profile.max_guidance)
    a = job("A", ("a red circle on a blue background", "a yellow star"), (11, 12), 4, guidance, size)
    b = job("B", ("a purple square",), (5,), 3, min(2.0, guidance), size)
    alone = {j.request_id: model.generate(j, threading.Event(), lambda *_: None).images for j in (a, b)}
    assert mad(images_of(run_loop(model, a))["A"], alone["A"]) == 0.0  # the loop is pipe(), to the bit
    joined = images_of(run_loop(model, a, b))
    for rid in "AB":
        assert mad(joined[rid], alone[rid]) <= 1.0, (rid, mad(joined[rid], alone[rid]))
    assert mad(joined["A"][:1], joined["B"]) > 5.0  # the pictures are not trivially alike

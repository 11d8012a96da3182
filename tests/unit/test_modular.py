"""``--model`` a ``ModularPipeline`` folder (issue 52 §5), in process: the tiny FLUX.1-dev build saved as a
modular pipeline (``tests/families.built_modular``: a ``modular_model_index.json`` and no ``model_index.json``)
loads through ``load_model`` as any model does, draws what the modular pipeline's own call draws, pixel for
pixel, reports its steps and stops at a step. Through the launched app: ``tests/server/test_modular_app.py``."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from pipeline.config import Settings
from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.engine.model.loading import load_model
from pipeline.errors import Cancelled
from pipeline.protocol import InferenceJob
from tests.families import built_modular

JOB = InferenceJob("m", ("a red circle", "a blue square"), ("", ""), (1, 2), 64, 64, 3, 3.5)


@pytest.fixture(scope="module")
def model() -> DiffusersModel:
    loaded = load_model(Settings(model=str(built_modular("flux-dev")), device="cpu"), warmup=False)
    assert isinstance(loaded, DiffusersModel)
    return loaded


def test_a_modular_folder_loads_through_the_same_profile_and_draws_its_own_pipelines_pixels(
    model: DiffusersModel,
) -> None:
    from diffusers import ModularPipeline

    folder = built_modular("flux-dev")
    assert (folder / "modular_model_index.json").exists() and not (folder / "model_index.json").exists()
    assert model.profile.pipeline_class == "FluxModularPipeline" and model.profile.loop_modes == ("text",)
    steps: list[object] = []
    result = model.generate(JOB, threading.Event(), lambda *event: steps.append(event))
    assert len(result.images) == 2 and result.images[0].size == (64, 64) and result.steps_done == 3 and len(steps) == 3
    theirs = ModularPipeline.from_pretrained(str(folder))
    theirs.load_components()
    plain = theirs(prompt=list(JOB.prompts), height=64, width=64, num_inference_steps=3, guidance_scale=3.5,
                   generator=[torch.Generator("cpu").manual_seed(s) for s in JOB.seeds], output="images")  # fmt: skip
    for ours, expected in zip(result.images, plain):
        assert np.array_equal(np.asarray(ours), np.asarray(expected))


def test_a_modular_call_stops_at_a_step(model: DiffusersModel) -> None:
    stop = threading.Event()
    with pytest.raises(Cancelled) as stopped:
        model.generate(JOB, stop, lambda *_: stop.set())
    assert stopped.value.steps_done == 1

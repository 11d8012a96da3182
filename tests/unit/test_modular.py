"""``--model`` a ``ModularPipeline`` folder (issue 52 §5), in process: the tiny FLUX.1-dev build saved as a
modular pipeline (``tests/families.built_modular``: a ``modular_model_index.json`` and no ``model_index.json``)
loads through ``load_model`` as any model does. FLUX.1 has its classic pipeline: served as ``FluxPipeline``
over the loaded components, with its step-level loop, drawing the modular pipeline's own pixels. A modular
class without one (FLUX.3's case; here the same folder with ``classic_of`` finding none) is served the
generic way: whole calls that draw its pixels, report their steps and stop at a step. Through the launched
app: ``tests/server/test_modular_app.py``."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.config import Settings
from pipeline.engine.model import modular
from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.engine.model.loading import load_model
from pipeline.errors import Cancelled
from pipeline.protocol import InferenceJob
from tests.families import built_modular

JOB = InferenceJob("m", ("a red circle", "a blue square"), ("", ""), (1, 2), 64, 64, 3, 3.5)


def load(**over: Any) -> DiffusersModel:
    loaded = load_model(Settings(model=str(built_modular("flux-dev")), device="cpu", **over), warmup=False)
    assert isinstance(loaded, DiffusersModel)
    return loaded


def own_pixels() -> list[Any]:
    """The modular pipeline's own call of ``JOB``."""
    from diffusers import ModularPipeline

    theirs = ModularPipeline.from_pretrained(str(built_modular("flux-dev")))
    theirs.load_components()
    return list(theirs(prompt=list(JOB.prompts), height=64, width=64, num_inference_steps=3, guidance_scale=3.5,
                       generator=[torch.Generator("cpu").manual_seed(s) for s in JOB.seeds], output="images"))  # fmt: skip


def same(got: tuple[Any, ...], expected: list[Any]) -> bool:
    return len(got) == len(expected) and all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, expected)
    )


def test_a_modular_folder_with_a_classic_pipeline_is_served_as_its_family_with_its_loop() -> None:
    folder = built_modular("flux-dev")
    assert (folder / "modular_model_index.json").exists() and not (folder / "model_index.json").exists()
    model = load()
    assert model.profile.pipeline_class == "FluxPipeline" and model.profile.family == "flux"
    assert model.loop_key(JOB) is not None  # FLUX.1's step-level loop
    assert same(model.generate(JOB, threading.Event(), lambda *_: None).images, own_pixels())


def test_a_modular_class_without_a_classic_pipeline_is_served_by_whole_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modular, "classic_of", lambda _modular: None)  # as FLUX.3's: modular only
    model = load()
    assert model.profile.pipeline_class == "FluxModularPipeline" and model.profile.loop_modes == ("text",)
    assert model.loop_key(JOB) is None  # whole calls
    steps: list[object] = []
    result = model.generate(JOB, threading.Event(), lambda *event: steps.append(event))
    assert result.steps_done == 3 and len(steps) == 3 and same(result.images, own_pixels())
    stop = threading.Event()
    with pytest.raises(Cancelled) as stopped:
        model.generate(JOB, stop, lambda *_: stop.set())
    assert stopped.value.steps_done == 1


def test_a_hub_id_whose_repository_has_only_a_modular_index_is_modular(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id (no local folder): its ``model_index.json`` missing and its ``modular_model_index.json``
    there make it a modular pipeline; a classic repository, or a hub that cannot be reached, does not
    (the hub's answers stood in by ``hf_hub_download``'s: this machine reaches no hub)."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    folder = built_modular("flux-dev")
    files = {"org/modular-only": {"modular_model_index.json"}, "org/classic": {"model_index.json"}}

    def download(repo: str, name: str, **_: Any) -> str:
        if repo not in files:
            raise OSError("the hub cannot be reached")
        if name not in files[repo]:
            raise EntryNotFoundError(f"{name} is not in {repo}")
        return str(folder / name) if name == "modular_model_index.json" else "/nonexistent/model_index.json"

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert modular.modular_class("org/modular-only") == "FluxModularPipeline"
    assert modular.modular_class("org/classic") is None and modular.modular_class("org/offline") is None

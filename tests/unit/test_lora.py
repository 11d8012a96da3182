"""Per-request LoRAs on the model side (``engine.lora``): tiny random peft LoRAs (``tests/loras.py``)
on the embedded model, on a UNet family (SDXL, job-level) and on a transformer family (FLUX dev, step-level).

- loaded once at start with ``load_lora_weights(adapter_name=NAME)``; a file that is not a LoRA for the
  model is refused at start, naming the file and why;
- a job's adapter changes the picture and equals a plain diffusers call with ``set_adapters([NAME],
  [SCALE])``; "none" equals a model with no LoRAs; the previous job's adapter never leaks;
- a step-level loop holds members with different adapters in one denoiser call (peft's mixed-adapter
  batches), each member's pixels as alone (that a LoRA runs at one scale per call, the scheduler's
  ``Batch.admits``, is tested through the LoRA in ``tests/unit/test_lora_serving.py``);
- under ``--compile`` the LoRAs hotswap into one slot (no recompiling), with the same pixels.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from pipeline.config import Settings
from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.errors import ModelRefused
from pipeline.protocol import InferenceJob
from tests.loras import BOUND, loras_of, mad, model_of, plain_diffusers

pytestmark = pytest.mark.timeout(600)


def job(lora: str = "", scale: float = 1.0, **over: Any) -> InferenceJob:
    base = InferenceJob("j", ("a red circle", "a blue square"), ("", ""), (3, 4), 64, 64, 3, 3.0)
    return replace(base, lora=lora, lora_scale=scale if lora else 0.0, **over)


def run(model: DiffusersModel, j: InferenceJob) -> tuple[Image.Image, ...]:
    return tuple(model.generate(j, threading.Event(), lambda *_: None).images)


# -- start ---------------------------------------------------------------------------------------------


def test_each_adapter_loads_once_with_its_components_hash_and_scale() -> None:
    model = model_of("default")
    infos = {i.name: i for i in model.profile.loras}
    assert list(infos) == ["a", "b", "c"]
    assert infos["a"].components == ("unet",)
    assert infos["b"].components == ("text_encoder", "unet")
    assert all(len(i.hash) == 12 and int(i.hash, 16) >= 0 for i in infos.values())
    assert len({i.hash for i in infos.values()}) == 3
    assert model.profile.lora_batching == "mixed"
    assert model.loads >= 1


def test_auto_batching_mixes_adapters_on_a_gpu_and_keeps_a_loop_per_adapter_on_the_cpu() -> None:
    from pipeline.engine.model.loading import lora_batching

    model = model_of("default")
    assert lora_batching(model.pipe, model.loras, "auto", "cpu") == "separate"  # measured: bench.lora
    assert lora_batching(model.pipe, model.loras, "auto", "cuda") == "mixed"
    assert lora_batching(model.pipe, model.loras, "separate", "cuda") == "separate"
    assert lora_batching(model.pipe, None, "mixed", "cuda") == "separate"  # nothing to mix


def _refusal(tmp_path: Path, spec: str) -> str:
    from pipeline.engine.model.loading import load_model

    with pytest.raises(ModelRefused) as caught:
        load_model(Settings(device="cpu", loras=(spec,)), warmup=False)
    return str(caught.value)


def test_a_missing_file_is_refused_at_start_naming_it(tmp_path: Path) -> None:
    message = _refusal(tmp_path, f"x={tmp_path / 'nowhere.safetensors'}")
    assert "--lora x" in message and "nowhere.safetensors" in message and "does not exist" in message


def test_a_file_that_is_not_weights_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "notes.safetensors"
    bad.write_bytes(b"these are not weights")
    message = _refusal(tmp_path, f"x={bad}")
    assert str(bad) in message and "is not a LoRA for this model" in message


def test_weights_that_match_no_layer_are_refused_naming_the_file_and_why(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    bad = tmp_path / "other.safetensors"
    save_file({"foo.lora_A.weight": torch.zeros(4, 8), "foo.lora_B.weight": torch.zeros(8, 4)}, bad)
    message = _refusal(tmp_path, f"x={bad}")  # diffusers loads nothing and only warns: the app refuses it
    assert str(bad) in message and "none of its weights matches a layer of StableDiffusionPipeline" in message
    save_file({"unet.nowhere.lora_A.weight": torch.zeros(4, 8), "unet.nowhere.lora_B.weight": torch.zeros(8, 4)}, bad)
    message = _refusal(tmp_path, f"x={bad}")
    assert str(bad) in message and "{'nowhere'} not found in the base model" in message


def test_a_lora_made_for_another_model_is_refused(tmp_path: Path) -> None:
    """A FLUX LoRA into the embedded SD model: nothing of it fits."""
    flux = loras_of("flux-dev")["a"]
    message = _refusal(tmp_path, f"x={flux}")
    assert str(flux) in message and "is not a LoRA for this model" in message


# -- one LoRA per job ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["default", "sdxl", "flux-dev"])
def test_an_adapter_changes_the_picture_and_equals_plain_diffusers(family: str) -> None:
    model = model_of(family)
    none, a, b = run(model, job()), run(model, job("a")), run(model, job("b", 0.6))
    assert mad(a, none) > 1.0 and mad(b, none) > 1.0 and mad(a, b) > 1.0
    assert mad(a, plain_diffusers(family, job("a"), "a")) <= BOUND
    assert mad(b, plain_diffusers(family, job("b", 0.6), "b")) <= BOUND
    assert mad(none, plain_diffusers(family, job(), None)) <= BOUND


@pytest.mark.parametrize("family", ["default", "flux-dev"])
def test_none_equals_no_adapters_and_the_last_adapter_never_leaks(family: str) -> None:
    with_adapters, without = model_of(family), model_of(family, loras=False)
    bare = run(without, job())
    run(with_adapters, job("b", 0.6))
    assert mad(run(with_adapters, job()), bare) == 0.0  # right after b: none is none
    a_first = run(with_adapters, job("a"))
    run(with_adapters, job("c", 1.5))
    assert mad(run(with_adapters, job("a")), a_first) == 0.0  # a after c is a, not a + c
    assert run(with_adapters, job("a", 0.5))  # another scale of the same LoRA is a switch too
    assert mad(run(with_adapters, job("a")), a_first) == 0.0


def test_a_switch_is_timed_and_never_reloads_the_model() -> None:
    model = model_of("default")
    loads = model.loads
    first = model.generate(job("a", 0.9), threading.Event(), lambda *_: None)
    again = model.generate(job("a", 0.9), threading.Event(), lambda *_: None)
    other = model.generate(job("b", 0.9), threading.Event(), lambda *_: None)
    assert first.lora_switch_ms > 0 and other.lora_switch_ms > 0
    assert again.lora_switch_ms == 0.0  # the same LoRA and scale: nothing to switch
    assert first.model_loads == again.model_loads == other.model_loads == loads == model.loads


def test_an_unknown_adapter_on_the_model_side_fails_the_job_not_the_model() -> None:
    with pytest.raises(ValueError, match="no LoRA named 'zzz'"):
        run(model_of("default"), job("zzz"))
    assert run(model_of("default"), job("a"))


# -- mixed adapters in one loop ---------------------------------------------------------------------------


def drive(model: DiffusersModel, jobs: list[InferenceJob]) -> tuple[dict[int, tuple[Image.Image, ...]], int]:
    """Every job in one loop from the first step; the pictures by index and the denoiser calls made."""
    loop = model.open_loop(jobs[0])
    denoiser = getattr(model.pipe, "unet", None) or model.pipe.transformer
    calls = [0]
    handle = denoiser.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        slots = [loop.add(replace(j, joinable=True)) for j in jobs]
        while any(loop.steps_done(s) < loop.total_steps(s) for s in slots):
            loop.step()
        out = loop.decode(slots)
    finally:
        handle.remove()
    return {i: tuple(out[s]) for i, s in enumerate(slots)}, calls[0]


@pytest.mark.parametrize("family", ["default", "flux-dev"])
def test_members_with_different_adapters_share_each_denoiser_call_with_their_own_pixels(family: str) -> None:
    model = model_of(family)
    jobs = [job("a", request_id="1"), job("b", 0.6, request_id="2", seeds=(7, 8)), job(request_id="3"),
            job("c", 1.5, request_id="4", num_inference_steps=2)]  # fmt: skip
    pictures, calls = drive(model, jobs)
    assert calls == 3  # one call a step for all four members (the longest runs 3 steps)
    for i, j in enumerate(jobs):
        assert mad(pictures[i], run(model, j)) <= BOUND, f"member {i} ({j.lora or 'none'})"
    assert mad(pictures[0], pictures[2]) > 1.0  # and the LoRAs did apply


@pytest.mark.parametrize("family", ["default", "flux-dev"])
def test_a_cached_member_with_its_adapter_leaves_the_calls_it_skips_with_its_own_pixels(family: str) -> None:
    """Issue 50 with mixed adapters: a taylorseer member (its own LoRA) skips steps 4 and 5 of 8, leaving
    those calls to the uncached member beside it (another LoRA); each draws what it draws alone."""
    model = model_of(family)
    cached = job("a", request_id="1", num_inference_steps=8, options=(("step_cache", "taylorseer"),))
    beside = job("b", 0.6, request_id="2", num_inference_steps=8, seeds=(7, 8))
    pictures, calls = drive(model, [cached, beside])
    assert calls == 8  # the uncached member computes every step; the cached one joins 6 of them
    for i, j in enumerate((cached, beside)):
        assert mad(pictures[i], drive(model, [j])[0][0]) <= BOUND, f"member {i} ({j.lora})"
    _, alone_calls = drive(model, [cached])
    assert alone_calls == 6  # its own steps 0-3, 6 and 7
    assert mad(pictures[0], run(model, replace(cached, options=()))) > 0.0  # the skipped steps were predicted


def test_an_image_to_image_member_with_its_adapter_shares_the_calls_with_its_own_pixels() -> None:
    """The SD loop takes image-to-image members (``loop_sd``): with their own adapter, beside text members
    with others, each as alone (the family's image-to-image pipeline with the LoRA set)."""
    import numpy as np

    model = model_of("default")
    rng = np.random.default_rng(6)
    pictures = tuple(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(2))
    jobs = [job("a", request_id="1"), job("b", 0.8, request_id="2", mode="image", images=pictures, strength=0.6,
                                          num_inference_steps=5), job(request_id="3")]  # fmt: skip
    shared, calls = drive(model, jobs)
    assert calls == 3  # the image member runs int(5 × 0.6) = 3 steps, in the same calls as the text members
    for i, j in enumerate(jobs):
        assert mad(shared[i], run(model, j)) <= BOUND, f"member {i} ({j.mode}, {j.lora or 'none'})"
    assert mad(shared[1], run(model, replace(jobs[1], lora="", lora_scale=0.0))) > 1.0  # the LoRA applied


def test_separate_batching_puts_the_adapter_in_the_loop_key() -> None:
    mixed = model_of("default")
    assert mixed.loop_key(job("a")) == mixed.loop_key(job("b")) == mixed.loop_key(job())
    separate = DiffusersModel(mixed.pipe, replace(mixed.profile, lora_batching="separate"), None, mixed.loras)
    assert separate.loop_key(job("a")) != separate.loop_key(job("b"))
    assert separate.loop_key(job("a")) != separate.loop_key(job("a", 0.5))
    assert separate.loop_key(job("a")) == separate.loop_key(job("a", seeds=(9, 10)))


# -- hotswap (--compile) ----------------------------------------------------------------------------------


def test_hotswap_gives_the_same_pixels_as_set_adapters() -> None:
    normal, swapped = model_of("default"), model_of("default", hotswap=True)
    assert swapped.loras is not None and swapped.loras.hotswap
    assert swapped.loras.names == ("a", "c")
    for j in (job("a"), job("c", 1.5), job(), job("a", 0.5), job("c")):
        assert mad(run(swapped, j), run(normal, j)) <= BOUND, j.lora or "none"
    assert mad(run(swapped, job("a")), run(swapped, job())) > 1.0


def test_under_compile_an_adapter_of_a_text_encoder_is_refused_naming_it() -> None:
    from pipeline.default_model import ensure_default_model
    from pipeline.engine.model.lora import load_loras
    from pipeline.engine.model.text_to_image import load_text_to_image

    pipe = load_text_to_image(str(ensure_default_model()), torch.float32)
    b = loras_of("default")["b"]
    with pytest.raises(ModelRefused, match="adapts a text encoder too.*hotswapped") as caught:
        load_loras(pipe, Settings(loras=(f"b={b}",)).lora_specs(), hotswap=True)
    assert str(b) in str(caught.value)

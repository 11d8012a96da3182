"""``--cpu-offload`` with step-level joining (issue 36 §3): a loop holds no more components on the device
at once than ``pipe()`` does. accelerate's model offload hooks take any device
(``enable_model_cpu_offload(device="cpu")``); a tracker on them records which components are resident."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from pipeline.config import Settings
from pipeline.engine.hosting.runner import NEVER
from tests.helpers import raw_request, run_loop


@pytest.fixture(scope="module")
def offloaded() -> Any:
    from pipeline.engine.model.loading import load_model

    model = load_model(Settings(), warmup=False)
    model.pipe.enable_model_cpu_offload(device="cpu")
    return model


@pytest.fixture
def resident(monkeypatch: pytest.MonkeyPatch, offloaded: Any) -> Iterator[list[set[str]]]:
    """Each time a component is called, the set then resident on the device (by component name): what
    accelerate's hooks would leave there on a GPU (with device="cpu" nothing moves, so the tracker
    follows the hooks' calls: a component's call loads it and moves the previous in the chain off,
    an explicit offload moves it off)."""
    from accelerate.hooks import CpuOffload  # type: ignore[import-untyped]

    names = {id(module): name for name, module in offloaded.pipe.components.items()}
    now: set[str] = set()
    seen: list[set[str]] = []
    onload, offload = CpuOffload.pre_forward, CpuOffload.init_hook

    def pre_forward(hook: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        out = onload(hook, module, *args, **kwargs)
        previous = hook.prev_module_hook
        if previous is not None:  # on a GPU the chain moves the previous model off here (not from the CPU)
            now.discard(names.get(id(previous.model), type(previous.model).__name__))
        now.add(names.get(id(module), type(module).__name__))
        seen.append(set(now))
        return out

    def init_hook(hook: Any, module: Any) -> Any:
        now.discard(names.get(id(module), type(module).__name__))
        return offload(hook, module)

    monkeypatch.setattr(CpuOffload, "pre_forward", pre_forward)
    monkeypatch.setattr(CpuOffload, "init_hook", init_hook)
    yield seen


def _job(model: Any, seed: int, steps: int, step_cache: str = "off") -> Any:
    from pipeline.request import Limits, validate

    raw = raw_request(seed=seed, num_inference_steps=steps, step_cache=step_cache)
    return validate(raw, Limits.for_model(model.profile)).to_job()


@pytest.mark.parametrize("step_cache", ["off", "taylorseer"])  # issue 50: a cached first member skips steps 4-5
def test_a_loop_with_a_joiner_holds_no_more_components_at_once_than_pipe(
    offloaded: Any, resident: list[set[str]], step_cache: str
) -> None:
    from pipeline.protocol import InferenceResult

    offloaded.generate(_job(offloaded, 1, 4), NEVER, lambda *_: None)
    by_pipe = max(len(s) for s in resident)
    resident.clear()
    first = _job(offloaded, 2, 8, step_cache)
    ended = run_loop(offloaded, first, _job(offloaded, 3, 2), join_at=2)
    assert all(isinstance(e, InferenceResult) for e in ended.values()) and len(ended) == 2, ended
    counted = {"method": "taylorseer", "computed": 6, "skipped": 2} if step_cache != "off" else {}
    assert dict(ended[first.request_id].step_cache) == counted
    assert by_pipe == 1 and max(len(s) for s in resident) <= by_pipe, [s for s in resident if len(s) > 1]
    assert {"unet", "text_encoder", "vae"} <= set().union(*resident)  # each was on the device in its turn


def test_a_controlnet_under_offload_is_on_the_device_only_beside_the_denoiser_as_in_its_pipelines_call(
    offloaded: Any, resident: list[set[str]]
) -> None:
    """Issue 51: under ``--cpu-offload`` a ControlNet stays in CPU memory and comes to the device when it
    runs (``controls.offload_controlnets``): a loop where a member with a map joins a plain one holds no
    more at once than the family's ControlNet pipeline's own call (the ControlNet beside one model at a
    time), and the ControlNet leaves with the UNet before a decode (the pipeline's call keeps it beside
    the VAE)."""
    from PIL import Image, ImageDraw

    from pipeline.engine.model.controls import offload_controlnets
    from pipeline.protocol import InferenceResult
    from pipeline.request import Limits, validate, with_pictures

    offloaded.control_hooks = offload_controlnets(offloaded.controlnets, "cpu")
    disc = Image.new("RGB", (64, 64))
    ImageDraw.Draw(disc).ellipse([5, 21, 27, 43], fill="white")
    data = __import__("io").BytesIO()
    disc.save(data, format="PNG")
    limits = Limits.for_model(offloaded.profile)
    raw = raw_request(seed=4, num_inference_steps=4, control="shapes", control_image=data.getvalue())
    mapped = with_pictures(validate(raw, limits, pictures_later=True), raw, limits).to_job()
    try:
        offloaded.generate(mapped, NEVER, lambda *_: None)  # StableDiffusionControlNetPipeline's call
        by_pipe = max(len(s) for s in resident)
        pairs = {frozenset(s) for s in resident if len(s) == 2}  # the ControlNet beside each model in turn
        assert by_pipe == 2 and frozenset({"unet", "ControlNetModel"}) in pairs, pairs
        resident.clear()
        ended = run_loop(offloaded, _job(offloaded, 2, 8), mapped, join_at=2)
        assert all(isinstance(e, InferenceResult) and e.ok for e in ended.values()) and len(ended) == 2, ended
        assert max(len(s) for s in resident) <= by_pipe, [s for s in resident if len(s) > by_pipe]
        assert {frozenset(s) for s in resident if len(s) == 2} <= pairs - {frozenset({"ControlNetModel", "vae"})}
        assert {"ControlNetModel", "vae"} <= set().union(*resident)
    finally:
        for hook in offloaded.control_hooks:
            hook.remove()
        offloaded.control_hooks = []

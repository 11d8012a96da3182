"""Device faults (issue 36 §1): memory, a poisoned device, or the request's own fault; a poisoned model
thread is dead, and says so, where a model process ends itself (tests/server/test_device_faults_app.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.engine.device_faults import kind_of
from pipeline.engine.hosting.runner import ModelRunner
from pipeline.errors import DeviceFailed, EngineDead
from tests.fakes import FakeModel
from tests.helpers import collect, raw_request, wait_for

STICKY = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"


class AcceleratorError(RuntimeError):
    """What torch >= 2.8 raises for a CUDA error (matched by name: no GPU build here)."""


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (RuntimeError(STICKY), "device_lost"),
        (RuntimeError("CUDA error: device-side assert triggered"), "device_lost"),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), "device_lost"),
        (RuntimeError("CUDA error: unspecified launch failure"), "device_lost"),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, ...)`"), "device_lost"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), "device_lost"),
        (AcceleratorError("an Xid 79 was reported"), "device_lost"),
        (RuntimeError("CUDA error: out of memory"), "out_of_memory"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "out_of_memory"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "out_of_memory"),
        (MemoryError(), "out_of_memory"),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x768 and 1024x320)"), "failed"),
        (TypeError("argument 'text': 'str' object cannot be interpreted"), "failed"),
        (ValueError("`height` and `width` have to be divisible by 8"), "failed"),
    ],
)
def test_each_fault_is_memory_a_poisoned_device_or_the_requests_own(exc: BaseException, kind: str) -> None:
    assert kind_of(exc) == kind


def sticky(job: Any) -> None:
    raise RuntimeError(STICKY)


def test_a_poisoned_model_thread_ends_and_fails_what_waits_instead_of_running_a_dead_device() -> None:
    runner = ModelRunner(lambda: FakeModel(outcome=sticky))
    runner.start(timeout=10)
    from pipeline.protocol import InferenceResult
    from pipeline.request import Limits, validate

    job = validate(raw_request(), Limits.for_model(runner.profile)).to_job()
    events = list(runner.stream(job))
    assert isinstance(events[-1], InferenceResult) and events[-1].reason == "device_lost", events
    assert "illegal memory access" in events[-1].message and "\n" not in events[-1].message
    # the thread ends right after it has sent that job's terminal event: not before the caller reads it
    wait_for(lambda: not runner.alive, "the poisoned model thread ends", timeout=10)
    again = list(runner.stream(job))
    assert isinstance(again[-1], InferenceResult) and again[-1].reason == "engine_dead"


@pytest.mark.anyio
async def test_on_a_model_thread_the_job_is_told_the_gpu_failed_and_health_says_dead(make_adapter: Any) -> None:
    adapter, _model = make_adapter(FakeModel(outcome=sticky))
    with pytest.raises(DeviceFailed, match="The GPU failed while running your job"):
        await collect(adapter, raw_request())
    # an orchestrator restarts the app on this; the thread ends right after the job's terminal event,
    # so a health check in that moment can still say "busy" (seen once under two busy workers)
    wait_for(lambda: adapter.health()["status"] == "dead", "health says dead", timeout=10)
    with pytest.raises(EngineDead):
        await collect(adapter, raw_request(seed=2))


@pytest.mark.anyio
async def test_a_fault_of_the_requests_own_fails_it_alone_and_the_model_carries_on(make_adapter: Any) -> None:
    failing = {"first": True}

    def once(job: Any) -> None:
        if failing.pop("first", False):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x768 and 1024x320)")

    adapter, model = make_adapter(FakeModel(outcome=once))
    from pipeline.errors import GenerationFailed

    with pytest.raises(GenerationFailed):
        await collect(adapter, raw_request())
    events = await collect(adapter, raw_request(seed=3))
    assert events and adapter.health()["status"] in ("ok", "busy") and len(model.calls) == 2


@pytest.fixture(scope="module")
def real() -> Any:
    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    return load_model(Settings(), warmup=False)


def _jobs(model: Any, n: int) -> list[Any]:
    from pipeline.request import Limits, validate

    limits = Limits.for_model(model.profile)
    return [validate(raw_request(seed=k, num_inference_steps=4), limits).to_job() for k in range(n)]


def _failing_unet(monkeypatch: pytest.MonkeyPatch, error: BaseException, at_call: int) -> None:
    """diffusers' own UNet fails at its ``at_call``-th call, as a device would (the app's code untouched)."""
    from diffusers import UNet2DConditionModel

    original, calls = UNet2DConditionModel.forward, []

    def forward(unet: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == at_call:
            raise error
        return original(unet, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", forward)


def test_out_of_memory_in_a_loop_frees_memory_only_once_the_failed_members_are_dropped(
    real: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 §5: the loop's members (their latents, embeddings) leave before the cache is emptied;
    before, ``empty_cache`` ran while they still held their memory."""
    import torch

    from pipeline.engine.hosting.runner import NEVER
    from pipeline.engine.loop.joining import LoopDriver
    from pipeline.protocol import InferenceResult, Submission

    _failing_unet(monkeypatch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), at_call=2)
    loop = real.open_loop(_jobs(real, 1)[0])
    held_at_free: list[int] = []
    monkeypatch.setattr(real, "free_memory", lambda: held_at_free.append(len(loop.members)))
    events: dict[str, list[Any]] = {}

    def Task(job: Any) -> Submission:
        return Submission(job, NEVER, events.setdefault(job.request_id, []).append)

    first, second = (Task(j) for j in _jobs(real, 2))
    pending = [second]
    LoopDriver(loop, lambda: pending.pop() if pending else None).run(first)
    ends = [evs[-1] for evs in events.values()]
    assert len(ends) == 2 and all(
        (isinstance(e, InferenceResult) and not e.ok) and e.reason == "out_of_memory" for e in ends
    ), ends
    assert held_at_free == [0], held_at_free  # freed once, with no member left holding tensors


@pytest.mark.parametrize("where", ["job", "loop"])
def test_an_allocation_failure_of_cublas_counts_as_out_of_memory(
    real: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from pipeline.protocol import InferenceResult

    error = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    _failing_unet(monkeypatch, error, at_call=1)
    freed: list[bool] = []
    monkeypatch.setattr(real, "free_memory", lambda: freed.append(True))
    monkeypatch.setattr(real, "loop_key", lambda job: ("k",) if where == "loop" else None)
    runner = ModelRunner(lambda: real)
    runner.start(timeout=30)
    try:
        events = list(runner.stream(_jobs(real, 1)[0]))
    finally:
        runner.shutdown(timeout=30)
    assert isinstance(events[-1], InferenceResult) and events[-1].reason == "out_of_memory", events[-1]
    assert freed and runner.alive is False  # memory given back; the runner was shut down, not poisoned

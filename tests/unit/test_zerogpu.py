"""ZeroGPU: every job crosses ``@spaces.GPU``'s process boundary as plain data, in its user's context.

The stand-in ``tests/stubs/spaces`` mirrors spaces 0.51.0's generator wrapper: it pickles the call's
arguments into a forked child, streams each yield back pickled, reads the caller's Gradio request
from its context variable, and closes the generator in the child when its caller closes the stream.
On the old boundary (a job, a ``threading.Event`` and a closure) the app died at its warm-up call:
``TypeError("cannot pickle '_thread.lock' object")``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline.engine.hosting.runner import ModelRunner
from pipeline.engine.hosting.zerogpu import MAX_SECONDS, MIN_SECONDS, ZeroGpuSide, gpu_seconds, model_side
from pipeline.protocol import InferenceJob, InferenceResult, StepEvent
from tests.fakes import WAIT, FakeModel
from tests.helpers import SPACES_STUBS, spaces_calls


def job(steps: int = 20, size: int = 512, images: int = 1) -> InferenceJob:
    return InferenceJob("r", ("p",) * images, ("",) * images, tuple(range(images)), size, size, steps, 7.5)


@pytest.fixture
def spaces_stub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The stand-in ``spaces`` on ZeroGPU hardware, imported fresh; yields its call log."""
    log = tmp_path / "spaces.jsonl"
    monkeypatch.syspath_prepend(str(SPACES_STUBS))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setenv("SPACES_STUB_LOG", str(log))
    _forget_spaces()
    yield log
    _forget_spaces()


def _forget_spaces() -> None:
    for name in [m for m in sys.modules if m == "spaces" or m.startswith("spaces.")]:
        del sys.modules[name]


def test_without_spaces_the_runner_is_the_model_side(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError
    runner = ModelRunner(FakeModel)
    assert model_side(runner) is runner


def test_spaces_on_other_hardware_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SPACES_STUBS))
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    _forget_spaces()
    try:
        runner = ModelRunner(FakeModel)
        assert model_side(runner) is runner
    finally:
        _forget_spaces()


def test_the_duration_grows_with_steps_pixels_and_images_within_bounds() -> None:
    base = gpu_seconds(job(20, 1024, 1))
    assert MIN_SECONDS < base < gpu_seconds(job(40, 1024, 1)) < gpu_seconds(job(50, 1024, 4)) < MAX_SECONDS
    assert gpu_seconds(job(20, 1280, 1)) > base and gpu_seconds(job(20, 1024, 2)) > base
    assert gpu_seconds(job(1, 64, 1)) == MIN_SECONDS and gpu_seconds(job(100, 2048, 8)) == MAX_SECONDS


def test_a_job_runs_in_the_gpu_process_and_streams_back(spaces_stub: Path) -> None:
    """The fake model behind the real runner, through the stand-in's fork: steps, then images."""
    runner = ModelRunner(lambda: FakeModel(previews=True))
    runner.start(timeout=WAIT)
    side = model_side(runner)
    assert isinstance(side, ZeroGpuSide)
    events = list(
        side.stream(InferenceJob("z", ("p",), ("",), (5,), 64, 64, 3, 7.5, preview_every=1), threading.Event())
    )
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1, 2, 3]
    assert isinstance(events[-1], InferenceResult) and events[-1].images[0].size == (64, 64)
    [call] = spaces_calls(spaces_stub)
    assert call["pid_child"] != os.getpid() and call["yields"] == 4 and call["error"] is None
    assert call["duration"] == MIN_SECONDS and not call["saw_request"]  # no Gradio request here
    runner.shutdown(timeout=WAIT)


def test_stop_takes_effect_at_the_next_yield_and_waits_for_the_gpu_process(spaces_stub: Path) -> None:
    # A step gate cannot order the forked child (it holds a copy): the fake model takes time instead.
    free = ModelRunner(lambda: FakeModel(step_seconds=0.02))
    free.start(timeout=WAIT)
    side = model_side(free)
    stop = threading.Event()
    seen: list[Any] = []
    for event in side.stream(InferenceJob("z", ("p",), ("",), (5,), 64, 64, 50, 7.5), stop):
        seen.append(event)
        if isinstance(event, StepEvent) and event.step == 3:
            stop.set()
    assert isinstance(seen[-1], InferenceResult) and seen[-1].reason == "cancelled", seen[-1]
    assert seen[-1].steps_done <= 4, "the GPU process ran on after the stop"
    last = spaces_calls(spaces_stub)[-1]
    assert last["stopped"] and last["yields"] < 50
    free.shutdown(timeout=WAIT)

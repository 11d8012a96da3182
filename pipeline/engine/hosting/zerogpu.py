"""Hugging Face ZeroGPU: each job runs under ``@spaces.GPU`` in ZeroGPU's own GPU process.

On a ZeroGPU Space the ``spaces`` package is installed and ``spaces.config.Config.zero_gpu`` is
true. A function decorated with ``spaces.GPU(duration=...)`` then runs, each call, in a forked
process that holds a GPU slice for at most ``duration`` seconds. The wrapper (spaces 0.51) pickles
the call's arguments into that process, streams a generator's yields back pickled, charges the
GPU time to the user whose Gradio request it finds in its context variable, and, when its caller
closes the stream, closes the generator in the child at its next yield.

So the decorated function is the boundary generator ``runner.run_job``: its one argument, the
``InferenceJob``, and every ``ModelEvent`` it yields are plain data. ``ZeroGpuSide`` is the serving
side's ``ModelSide`` there: the serving side calls it from the job's copied ``contextvars``
context (the head request's), so ``spaces`` charges that user. Everywhere else ``model_side``
returns the in-process ``ModelRunner`` itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, Generator, Mapping

from ...protocol import InferenceJob, InferenceResult, ModelEvent, ModelProfile, ModelSide, StepEvent, StopFlag
from .runner import ModelRunner, install, run_job

log = logging.getLogger(__name__)

# A conservative speed for SD-class models on a ZeroGPU slice (an H200 half): pixel-steps per
# second per image (SD 1.5 at 512x512 runs ~20 steps/s, i.e. ~5M pixel-steps/s: half of that here).
PIXEL_STEPS_PER_SECOND = 2.5e6
BASE_SECONDS = 5  # moving the pipeline onto the slice, the VAE decode, the text encoders
MIN_SECONDS, MAX_SECONDS = 10, 300


def gpu_seconds(job: InferenceJob, *_: Any, **__: Any) -> int:
    """The duration to ask for: steps x pixels x images at a conservative speed, plus a base."""
    work = job.num_inference_steps * job.width * job.height * len(job.seeds)
    return int(min(MAX_SECONDS, max(MIN_SECONDS, math.ceil(BASE_SECONDS + work / PIXEL_STEPS_PER_SECOND))))


def zero_gpu_active() -> bool:
    try:
        import spaces.config
    except ImportError:
        return False
    return bool(getattr(spaces.config.Config, "zero_gpu", False))


class ZeroGpuSide:
    """``ModelSide`` on ZeroGPU: the runner's profile and tokenizer here, its jobs in the GPU process."""

    def __init__(self, runner: ModelRunner, gpu: Callable[..., Any]) -> None:
        self.runner = runner
        install(runner)  # what run_job finds, here and (inherited) in the forked child
        self._gpu_stream: Callable[[InferenceJob], Generator[ModelEvent, None, None]] = gpu(duration=gpu_seconds)(
            run_job
        )

    @property
    def profile(self) -> ModelProfile:
        return self.runner.profile

    @property
    def alive(self) -> bool:
        return self.runner.alive

    def count_tokens(self, text: str, model: str = "") -> Mapping[str, int]:
        return self.runner.count_tokens(text, model)

    def shutdown(self, timeout: float | None = None) -> None:
        self.runner.shutdown(timeout)

    many_in_flight = False  # one GPU call at a time: ``submit`` runs it on the caller's thread

    def submit(self, job: InferenceJob, stop: StopFlag, emit: Callable[[ModelEvent], None]) -> None:
        for event in self.stream(job, stop):
            emit(event)

    def stream(self, job: InferenceJob, stop: StopFlag) -> Generator[ModelEvent, None, None]:
        """Only ``job`` crosses. Stop: close the wrapper's stream; the child stops at its next yield."""
        step = 0
        try:
            with contextlib.closing(self._gpu_stream(job)) as events:
                for event in events:
                    yield event
                    if isinstance(event, InferenceResult):
                        return
                    if isinstance(event, StepEvent):
                        step = event.step
                    if stop.is_set():
                        break  # closing returns once the GPU process has stopped the job
        except Exception as exc:  # the wrapper's own errors (pickling, "ZeroGPU worker error", quota)
            log.exception("the ZeroGPU call for job %s failed", job.request_id)
            yield InferenceResult.ended_by("failed", f"{type(exc).__name__}: {exc}", step)
            return
        if stop.is_set():
            yield InferenceResult.ended_by("cancelled", "stopped", step)
        else:
            yield InferenceResult.ended_by("failed", "the ZeroGPU call ended without a result", step)


def model_side(runner: ModelRunner) -> ModelSide:
    """The runner itself, or, on ZeroGPU hardware, the runner behind ``@spaces.GPU``."""
    if not zero_gpu_active():
        return runner
    import spaces

    log.info("ZeroGPU: every job runs under @spaces.GPU, with a duration from steps x pixels x images")
    return ZeroGpuSide(runner, spaces.GPU)

"""Step-level batching on the model side: one denoising loop that jobs enter and leave at step boundaries.

Job-level batching forms a batch only when the GPU frees up, so a burst's first request runs alone
and a request that arrives one step into a job waits for the whole job. Here the model thread owns
the denoising loop instead of calling the pipeline once per job:

- **Members.** Every job in the loop (an ``InferenceJob`` with ``joinable=True``) keeps its own
  timestep or sigma index, its own sampler (a scheduler instance), its own generators and its own guidance, so
  it can enter at any step boundary and leave when its own steps are done. Members share what the
  loop's key says (size and sampler); they may differ in prompt, negative prompt, seed, image
  count, steps and guidance.
- **One step.** ``Loop.step`` runs one denoiser call for every member, each at its own timestep,
  then each member's own sampler's ``step`` on its own slice: the per-sample arithmetic is the
  sampler's own, so a member's pixels are the same as alone (within batch arithmetic).
- **Joining.** Between steps, ``LoopDriver`` takes every waiting task that the serving side's
  scheduler (``serving.scheduler.Scheduler``, the one place that decides who shares a loop: fair
  order, ``max_batch_size``, device memory, LoRA scales) tagged for this loop; the text encoders
  run then, on this thread, for the joiners only.
- **Leaving.** A member whose steps are done is decoded then (with any others finishing at the
  same step); a member whose stop is set leaves at the next boundary without a decode, and the
  others are untouched. Every member gets exactly one terminal event of its own.

``Loop`` is what a model implements to take part (``DiffusersModel`` for the SD family and the
flow-matching families, ``SimulatedModel``, the tests' fake); a model without ``loop_key`` or with
``loop_key(job) is None`` runs the job as one call, as before.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Protocol, Sequence

from PIL import Image

from ...protocol import InferenceJob, InferenceResult, StepEvent, Submission, encoded
from ..device_faults import fault_event

log = logging.getLogger(__name__)


class Loop(Protocol):
    """A running denoising loop, owned by the model thread (never called from any other)."""

    def add(self, job: InferenceJob) -> int:
        """Take ``job`` in: encode its prompts, draw its starting latents from its seeds (one CPU
        generator per image, as the pipeline does), build its own scheduler (``job.sampler``,
        ``job.num_inference_steps``). Returns its slot; its first step runs at the next ``step``."""
        ...

    def step(self) -> Mapping[int, Mapping[int, Image.Image]]:
        """One denoising step of every member, each at its own timestep and guidance.

        Returns previews by slot (image index in the member's job -> a small RGB picture) for the
        members on a preview step (``job.preview_every``, ``job.preview_images``).
        """
        ...

    def steps_done(self, slot: int) -> int: ...

    def total_steps(self, slot: int) -> int: ...

    def decode(self, slots: Sequence[int]) -> Mapping[int, tuple[Image.Image, ...]]:
        """Decode these members' latents together and drop them from the loop: slot -> its images."""
        ...

    def remove(self, slot: int) -> None:
        """Drop a member without decoding it (it was cancelled)."""
        ...

    @property
    def images(self) -> int:
        """Images in the loop now."""
        ...

    def peak_memory_bytes(self) -> int | None: ...


class JoiningModel(Protocol):
    """A model that can run jobs step-level (see the module docstring)."""

    def loop_key(self, job: InferenceJob) -> Hashable | None:
        """Jobs with equal keys may share a loop; ``None``: this job runs as one plain call."""
        ...

    def open_loop(self, job: InferenceJob) -> Loop:
        """A new, empty loop for jobs with ``job``'s key."""
        ...


def in_a_loop(model: object, job: InferenceJob) -> bool:
    """Whether ``job`` runs in a step-level loop on ``model``: the scheduler tagged it for one
    (``job.joinable``, ``job.loop_id``) and the model can loop it (its ``loop_key`` is not None)."""
    key_of = getattr(model, "loop_key", None)
    return bool(job.joinable and job.loop_id and key_of is not None and key_of(job) is not None)


def enters_after_members(job: InferenceJob, in_loop: Sequence[str]) -> bool:
    """Whether ``job`` must wait at this boundary: members it was sent to replace (``job.enters_after``,
    a step early) are still in the loop (``in_loop``: their request ids)."""
    return any(rid in job.enters_after for rid in in_loop)


@dataclass
class _Seat:
    task: Submission
    slot: int
    joined_at: int  # loop steps run before it joined
    started: float
    note: Callable[[int], None] | None
    most_images: int = 0
    most_jobs: int = 0


class LoopDriver:
    """Runs one loop until its last member has left. ``pull()`` hands over the next waiting task
    with this loop's key, or ``None`` (the runner keeps the others for after the loop)."""

    def __init__(self, loop: Loop, pull: Callable[[], Submission | None]) -> None:
        self.loop = loop
        self._pull = pull
        self.members: list[_Seat] = []
        self.steps = 0  # loop steps run so far

    def run(self, first: Submission) -> None:
        self._admit(first)
        while True:
            # 1. Join: every waiting compatible task enters now, before this step.
            while (task := self._pull()) is not None:
                self._admit(task)
            # 2. Leave: members stopped since the last boundary go without another step.
            self._leave_stopped()
            if not self.members:
                return
            images, jobs = self.loop.images, len(self.members)
            for m in self.members:
                m.most_images, m.most_jobs = max(m.most_images, images), max(m.most_jobs, jobs)
            # 3. One step for everyone; its progress to each member.
            try:
                previews = self.loop.step()
            except BaseException as exc:
                self._fail_all(exc)
                if not isinstance(exc, Exception):
                    raise
                self._release()  # the failed members' tensors are gone now: their memory can go back
                return
            self.steps += 1
            for m in self.members:
                done = self.loop.steps_done(m.slot)
                if m.note is not None:
                    m.note(done)
                own = previews.get(m.slot, {})
                m.task.emit(StepEvent(done, self.loop.total_steps(m.slot), encoded(own)))
            # 4. Members told to stop leave now (at most this one step after the stop, no decode).
            self._leave_stopped()
            # 5. Members whose own steps are done are decoded together and leave.
            finished = [m for m in self.members if self.loop.steps_done(m.slot) >= self.loop.total_steps(m.slot)]
            if finished:
                self._finish(finished)

    def _admit(self, task: Submission) -> None:
        if task.stop.is_set():
            task.emit(InferenceResult.ended_by("cancelled", "stopped before its first step", 0))
            return
        try:
            slot = self.loop.add(task.job)
        except Exception as exc:  # this job's fault (its prompt, its sampler): the others carry on
            task.emit(_error_of(exc))
            self._release()
            return
        note = getattr(task.stop, "note", None)
        self.members.append(_Seat(task, slot, self.steps, time.time(), note if callable(note) else None))

    def _leave_stopped(self) -> None:
        for m in [m for m in self.members if m.task.stop.is_set()]:
            self.members.remove(m)
            done = self.loop.steps_done(m.slot)
            self.loop.remove(m.slot)
            m.task.emit(InferenceResult.ended_by("cancelled", "stopped", done))

    def _finish(self, finished: list[_Seat]) -> None:
        for m in finished:
            self.members.remove(m)
        try:
            images = self.loop.decode([m.slot for m in finished])
        except Exception as exc:
            for m in finished:
                m.task.emit(_error_of(exc))
            self._release()
            return
        ended, peak = time.time(), self.loop.peak_memory_bytes()
        fields = getattr(self.loop, "result_fields", None)
        for m in finished:
            m.task.emit(
                InferenceResult(
                    tuple(images[m.slot]),
                    m.task.job.steps_run,  # its own count (image-to-image: steps × strength)
                    m.started,
                    ended,
                    peak,
                    batch_images=m.most_images,
                    batch_jobs=m.most_jobs,
                    joined_at_step=m.joined_at,
                    **(fields(m.slot) if fields is not None else {}),
                )
            )

    def _release(self) -> None:
        release = getattr(self.loop, "release", None)
        if callable(release):
            release()

    def _fail_all(self, exc: BaseException) -> None:
        members, self.members = self.members, []
        event = _error_of(exc) if isinstance(exc, Exception) else InferenceResult.ended_by("engine_dead", repr(exc))
        if event.reason == "failed":
            log.error("a step of a loop of %d jobs failed", len(members), exc_info=exc)
        for m in members:
            with contextlib.suppress(Exception):
                self.loop.remove(m.slot)
            m.task.emit(event)


def _error_of(exc: Exception) -> InferenceResult:
    return fault_event(exc)  # a poisoned device ends the model side after the loop (``ModelRunner``)

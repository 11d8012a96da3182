"""A fake model with the same small protocol as the real one: scriptable, gated, counted.

Ordering in tests comes from these gates (``threading.Event``/``Semaphore``), never from sleeps.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from PIL import Image

from pipeline.errors import Cancelled
from pipeline.protocol import InferenceJob, InferenceResult, ModelProfile, StepCallback, StopFlag

FAKE_PROFILE = ModelProfile(
    name="fake-model",
    pipeline_class="FakePipeline",
    sampler="EulerDiscreteScheduler",
    device="cpu",
    dtype="float32",
    default_width=64,
    default_height=64,
    default_steps=4,
    default_guidance=7.5,
    max_steps=50,
    max_size=512,
    text_encoders=(("CLIP", 75),),
    samplers=("default", "Euler", "Euler a", "DPM++ 2M Karras", "DDIM", "UniPC"),  # a UNet family's
    modes=("text", "image", "inpaint"),  # an image mode runs its steps_run (steps × strength), like diffusers
)

# What validation says of a width of 7 px within FAKE_PROFILE's limits.
FAKE_WIDTH_ERROR = "width must be a multiple of 8 between 64 and 512; got 7"
WAIT = 30.0  # generous bound on any gate wait: a deadlock fails instead of hanging


@dataclass
class FakeModel:
    profile: ModelProfile = FAKE_PROFILE
    hold: bool = False  # each generate call blocks until ``release`` gives it a permit
    hold_wait: float = WAIT  # how long a held call waits for its permit before failing the job
    step_gate: threading.Semaphore | None = None  # when set, each step waits for a permit
    permit_wait: float = WAIT  # how long a step waits for its permit before failing the job
    outcome: Callable[[InferenceJob], None] | None = None  # may raise to script a failure
    prepare_hook: Callable[[str], None] | None = None  # runs inside count_tokens (prepare)
    calls: list[InferenceJob] = field(default_factory=list)
    steps_run: dict[str, int] = field(default_factory=dict)
    active: int = 0
    max_active: int = 0
    release: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    entered: threading.Event = field(default_factory=threading.Event)
    returned: list[str] = field(default_factory=list)  # request ids, in the order calls returned
    log: list[tuple[str, str]] = field(default_factory=list)  # ("enter"|"return", request id)
    decodes: int = 0  # images "decoded" (a cancelled job must not get here)
    decodes_by_id: dict[str, int] = field(default_factory=dict)
    stops: dict[str, StopFlag] = field(default_factory=dict)  # each job's stop, as the model sees it
    previews: bool = False  # a small preview image for each previewed image on its preview steps
    step_seconds: float = 0.0  # compute time per step (where no gate can reach: a forked GPU process)
    joining: bool = False  # joinable jobs run step-level in a FakeLoop (engine.joining)
    loop_steps: list[tuple[tuple[str, int], ...]] = field(default_factory=list)  # per loop step: (id, its step)
    loop_step_started: int = 0  # loop steps begun (a step waiting for its permit counts)
    memory: tuple[int, int] | None = None  # a device's (total, idle) bytes; None: a CPU, which reports none
    bytes_per_image: int = 0  # what each image in a loop adds to its peak, on that device
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.joining:
            self.profile = dataclasses.replace(self.profile, step_joining=True)

    def device_memory(self) -> tuple[int, int] | None:
        return self.memory

    def loop_key(self, job: InferenceJob) -> Hashable | None:
        """As ``DiffusersModel.loop_key``: the modes the profile's loops take, no hires fix."""
        if not self.joining or job.mode not in self.profile.loop_modes or job.hires_width:
            return None
        return (job.width, job.height, job.sampler)

    def open_loop(self, job: InferenceJob) -> FakeLoop:
        return FakeLoop(self)

    def image(self, job: InferenceJob, seed: int) -> Image.Image:
        return Image.new("RGB", (job.width, job.height), (seed % 256, (seed >> 8) % 256, 7))

    def _previews(self, job: InferenceJob, step: int) -> dict[int, Image.Image]:
        if not (self.previews and job.preview_every and step % job.preview_every == 0):
            return {}
        return {i: Image.new("RGB", (8, 8), (step % 256, 0, 0)) for i in job.preview_images}

    def count_tokens(self, text: str) -> dict[str, int]:
        if self.prepare_hook is not None:
            self.prepare_hook(text)
        return {"CLIP": len(text.split())}

    def _enter(self, job: InferenceJob, stop: StopFlag | None = None) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls.append(job)
            self.log.append(("enter", job.request_id))
            if stop is not None:
                self.stops[job.request_id] = stop
        self.entered.set()

    def _leave(self, job: InferenceJob) -> None:
        with self._lock:
            self.active -= 1
            self.returned.append(job.request_id)
            self.log.append(("return", job.request_id))

    def _decode(self, job: InferenceJob) -> tuple[Image.Image, ...]:
        """The end of a job: the ``hold`` and ``outcome`` scripts, then its images (counted)."""
        if self.hold:
            assert self.release.acquire(timeout=self.hold_wait), "release never came"
        if self.outcome is not None:
            self.outcome(job)
        self.decodes += 1
        self.decodes_by_id[job.request_id] = self.decodes_by_id.get(job.request_id, 0) + 1
        return tuple(self.image(job, seed) for seed in job.seeds)

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        self._enter(job, stop)
        started = time.time()
        steps = 0
        total = job.steps_run  # an image mode: int(steps × strength); hires fix: both passes
        try:
            for i in range(total):
                if self.step_gate is not None:
                    assert self.step_gate.acquire(timeout=self.permit_wait), "step permit never came"
                if self.step_seconds:
                    time.sleep(self.step_seconds)
                steps = i + 1
                self.steps_run[job.request_id] = steps
                on_step(steps, total, self._previews(job, steps))
                if stop.is_set():
                    raise Cancelled(steps_done=steps)
            return InferenceResult(self._decode(job), steps, started, time.time())
        finally:
            self._leave(job)


@dataclass(frozen=True)
class FakeLoader:
    """A picklable loader for a model process (``engine.process``): a ``FakeModel`` built there.

    The profile's name says where the model was loaded (process id and thread name). With
    ``fail_marker``, the first load creates that file and every later load fails (a model that can
    no longer load: the restarts run out).
    """

    step_seconds: float = 0.0
    fail_marker: str | None = None
    joining: bool = False

    def __call__(self) -> FakeModel:
        import os
        from pathlib import Path

        if self.fail_marker is not None:
            marker = Path(self.fail_marker)
            if marker.exists():
                raise RuntimeError("scripted load failure")
            marker.touch()
        where = f"fake-model pid={os.getpid()} thread={threading.current_thread().name}"
        profile = dataclasses.replace(FAKE_PROFILE, name=where)
        return FakeModel(profile, step_seconds=self.step_seconds, previews=True, joining=self.joining)


class FakeLoop:
    """``engine.joining.Loop`` for ``FakeModel``: the same gates, counters and images as its ``generate``.

    Every ``step`` takes one ``step_gate`` permit for all members together (one denoiser call) and
    records which members it ran at which of their own steps (``FakeModel.loop_steps``).
    """

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.members: dict[int, list] = {}  # slot -> [job, steps done]
        self._slots = itertools.count()
        self.most_images = 0  # the most images it held at once (its "peak memory" on a fake device)

    def add(self, job: InferenceJob) -> int:
        self.model._enter(job)
        slot = next(self._slots)
        self.members[slot] = [job, 0]
        self.most_images = max(self.most_images, self.images)
        return slot

    def step(self) -> dict[int, dict[int, Image.Image]]:
        m = self.model
        m.loop_step_started += 1
        if m.step_gate is not None:
            assert m.step_gate.acquire(timeout=m.permit_wait), "step permit never came"
        if m.step_seconds:
            time.sleep(m.step_seconds)
        previews = {}
        for slot, member in self.members.items():
            member[1] += 1
            job, done = member
            m.steps_run[job.request_id] = done
            if own := m._previews(job, done):
                previews[slot] = own
        m.loop_steps.append(tuple((job.request_id, done) for job, done in self.members.values()))
        return previews

    def steps_done(self, slot: int) -> int:
        return int(self.members[slot][1])

    def total_steps(self, slot: int) -> int:
        return int(self.members[slot][0].steps_run)  # an image-to-image member runs steps × strength

    def decode(self, slots: Sequence[int]) -> dict[int, tuple[Image.Image, ...]]:
        out = {}
        try:
            for slot in slots:
                out[slot] = self.model._decode(self.members[slot][0])
        finally:
            for slot in slots:
                self.remove(slot)
        return out

    def remove(self, slot: int) -> None:
        member = self.members.pop(slot, None)
        if member is not None:
            self.model._leave(member[0])

    @property
    def images(self) -> int:
        return sum(job.num_images for job, _ in self.members.values())

    def peak_memory_bytes(self) -> int | None:
        if self.model.memory is None:
            return None
        return self.model.memory[1] + self.model.bytes_per_image * self.most_images

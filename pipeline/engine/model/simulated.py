"""A simulated fast device, as a model: ``--model sim:cpu_ms=5,dev_ms=15,decode_ms=8,size=512,steps=1``.

A slow model hides a slow server. This one behaves like a GPU pipeline as the server sees it:

- per denoising step it holds the GIL for ``cpu_ms`` (busy Python, as eager kernel launches do),
  then waits ``dev_ms`` with the GIL released while "the device" works; a batch of b images takes
  ``dev_ms * (1 + batch_cost * (b - 1))`` of device time per step (``batch_cost`` 0.6 unless given:
  a big device running small images batches almost for free, 0.05; a busy one barely gains, 0.9);
- at the end it "decodes" for ``decode_ms`` per image, GIL released;
- its images are ``size`` px pictures with realistic content (smooth gradients and mild noise), so
  that encoding one costs what a real picture costs;
- it carries what a real pipeline carries per step: latents of the real shape for the size (4
  channels at 1/8 of the picture, float32), stepped toward the picture's own latents, and, on the
  job's preview steps, previews made the way a real model makes them (a per-pixel map of the
  latents to colours at display size, handed to the step callback as pictures, which the model
  thread encodes as it does a real model's). Nothing picture-sized crosses per step, as in a real
  pipeline: the latents stay with the model.

Progress, stop and previews behave like any model's, and so does step-level joining
(``engine.loop.joining``): ``SimLoop`` charges each step the device time of the images in the loop then.
It is a benchmark tool (issue 17's "fast device" profiles), documented in the README, and never
the default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Sequence

import numpy as np
from PIL import Image

from ... import protocol
from ...errors import Cancelled
from ...protocol import InferenceJob, InferenceResult, LoraUse, ModelProfile, StepCallback, StopFlag, display_size

PREFIX = "sim:"
POOL = 8  # distinct pictures per size (by seed)
BATCH_COST = 0.6  # each extra image in a batch costs this fraction of one image's device time
KEYS = ("cpu_ms", "dev_ms", "decode_ms", "size", "steps", "batch_cost")
LATENT_CHANNELS, LATENT_FACTOR = 4, 8  # an SD-like VAE's latents: 4 channels at 1/8 of the picture


@dataclass(frozen=True)
class SimSpec:
    cpu_ms: float = 5.0
    dev_ms: float = 15.0
    decode_ms: float = 8.0
    size: int = 512
    steps: int = 1
    batch_cost: float = BATCH_COST

    def device_ms(self, images: int) -> float:
        """Device time of one step of a batch of ``images``."""
        return self.dev_ms * (1 + self.batch_cost * (images - 1))

    @classmethod
    def parse(cls, model: str) -> SimSpec:
        """``sim:key=value,...``; any key may be left out. A bad key or value raises ``ValueError``."""
        if not model.startswith(PREFIX):
            raise ValueError(f"a simulated model is named {PREFIX}key=value,...; got {model!r}")
        spec = cls()
        for item in filter(None, model[len(PREFIX) :].split(",")):
            key, _, value = item.partition("=")
            if key not in KEYS:
                raise ValueError(f"unknown key {key!r} in {model!r}; the keys are {', '.join(KEYS)}")
            number: Any = int(value) if key in ("size", "steps") else float(value)
            if number < 0 or (key in ("size", "steps") and number < 1) or (key == "size" and number % 8):
                raise ValueError(f"{key}={value} in {model!r}: times >= 0, steps >= 1, size a multiple of 8")
            if key == "batch_cost" and number > 1:
                raise ValueError(f"batch_cost={value} in {model!r}: between 0 (free) and 1 (no gain)")
            spec = replace(spec, **{key: number})
        return spec


def hold_gil(ms: float) -> None:
    """Busy Python for ``ms`` milliseconds: the thread keeps the GIL but for the interpreter's switches."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def picture(size: int, seed: int) -> Image.Image:
    """A smooth colour field with mild noise: as costly to PNG-encode as a generated picture."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a, b, c = rng.uniform(0.5, 3.0, 3), rng.uniform(0, 2 * np.pi, 3), rng.uniform(0, 1, 3)
    channels = [0.5 + 0.4 * np.sin(a[i] * np.pi * (xs * c[i] + ys * (1 - c[i])) + b[i]) for i in range(3)]
    image = np.stack(channels, axis=-1) + rng.normal(0, 0.02, (size, size, 3))
    return Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8), "RGB")


class SimulatedModel:
    """``protocol.Model`` for a simulated device; ``busy`` and ``wait`` are injectable for tests."""

    def __init__(
        self,
        spec: SimSpec,
        name: str,
        *,
        busy: Callable[[float], None] = hold_gil,
        wait: Callable[[float], None] = lambda ms: time.sleep(ms / 1000),
    ) -> None:
        self.spec = spec
        self._busy = busy
        self._wait = wait
        self._pictures: dict[tuple[int, int, int], Image.Image] = {}
        self._latents: dict[tuple[int, int, int], np.ndarray] = {}
        self.profile = ModelProfile(
            name=name,
            pipeline_class="SimulatedDevice",
            sampler="Simulated",
            device="sim",
            dtype="none",
            default_width=spec.size,
            default_height=spec.size,
            default_steps=spec.steps,
            default_guidance=0.0,
            max_steps=max(100, spec.steps),
            max_size=max(1024, spec.size),
            size_multiple=8,
            family="other",
            step_joining=True,
        )

    def loop_key(self, job: InferenceJob) -> Hashable | None:
        model = str(dict(job.options).get("model", ""))
        return protocol.loop_key(job.width, job.height, job.sampler, LoraUse(), per_lora=False, model=model)

    def open_loop(self, job: InferenceJob) -> SimLoop:
        return SimLoop(self)

    def count_tokens(self, text: str) -> dict[str, int]:
        return {"CLIP": len(text.split())}

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        spec, images = self.spec, job.num_images
        if stop.is_set():
            raise Cancelled(steps_done=0)
        started = time.time()
        latents = SimLatents(self, job)
        for step in range(1, job.num_inference_steps + 1):
            self._busy(spec.cpu_ms)
            self._wait(spec.device_ms(images))
            latents.step()
            on_step(step, job.num_inference_steps, latents.previews())
            if stop.is_set():
                raise Cancelled(steps_done=step)
        self._wait(spec.decode_ms * images)
        pictures = tuple(self._picture(job.width, job.height, seed) for seed in job.seeds)
        return InferenceResult(pictures, job.num_inference_steps, started, time.time())

    def _latents_of(self, width: int, height: int, seed: int) -> np.ndarray:
        """The picture's latents: its colours in [0, 1] at 1/8, and a fourth channel (made once per picture)."""
        key = (width, height, seed % POOL)
        if key not in self._latents:
            grid = (max(1, width // LATENT_FACTOR), max(1, height // LATENT_FACTOR))
            small = self._picture(width, height, seed).resize(grid, Image.Resampling.BOX)
            rgb = np.asarray(small, dtype=np.float32).transpose(2, 0, 1) / 255
            self._latents[key] = np.concatenate([rgb, rgb.mean(axis=0, keepdims=True)])
        return self._latents[key]

    def _picture(self, width: int, height: int, seed: int) -> Image.Image:
        """One of ``POOL`` pictures per size, made once: the device's time is ``decode_ms``, not this."""
        key = (width, height, seed % POOL)
        if key not in self._pictures:
            self._pictures[key] = picture(max(width, height), key[2]).crop((0, 0, width, height))
        return self._pictures[key]


class SimLatents:
    """One job's latents on the simulated device: noise at first, each step a share closer to its
    pictures' own latents (the picture's colours pooled to the latent grid, and a fourth channel),
    so that its previews, like a real model's, come to look like the picture they announce."""

    def __init__(self, model: SimulatedModel, job: InferenceJob) -> None:
        self.job = job
        h, w = max(1, job.height // LATENT_FACTOR), max(1, job.width // LATENT_FACTOR)
        rng = np.random.default_rng(job.seeds[0] if job.seeds else 0)
        self.noise = rng.standard_normal((job.num_images, LATENT_CHANNELS, h, w), dtype=np.float32)
        self.target = np.stack([model._latents_of(job.width, job.height, seed) for seed in job.seeds])
        self.latents = self.target + self.noise
        self.done = 0

    def step(self) -> None:
        """The denoised estimate after this step: the noise left falls as the square of the steps left
        (a sampler's estimate sharpens fast), and none after the last."""
        self.done += 1
        left = (self.job.num_inference_steps - self.done) / self.job.num_inference_steps
        np.multiply(self.noise, left * left, out=self.latents)
        self.latents += self.target

    def previews(self) -> dict[int, Image.Image]:
        """The job's previews on its preview steps (none on the last), as a real model's StepWatch."""
        job, every = self.job, self.job.preview_every
        if not every or self.done % every or self.done >= job.num_inference_steps:
            return {}
        size = display_size(job.width, job.height)
        shown = {}
        for index in job.preview_images:
            if index < len(self.latents):
                rgb = np.clip(self.latents[index, :3].transpose(1, 2, 0), 0, 1)  # the map: 3 of 4 channels
                picture = Image.fromarray((rgb * 255).round().astype(np.uint8), "RGB")
                shown[index] = picture.resize(size, Image.Resampling.BILINEAR)
        return shown


class SimLoop:
    """``engine.loop.joining.Loop`` on the simulated device: a step costs ``cpu_ms`` of GIL, then the device
    time of a batch of the images in the loop; a finishing member's decode costs ``decode_ms`` per image."""

    def __init__(self, model: SimulatedModel) -> None:
        self.model = model
        self.members: dict[int, SimLatents] = {}  # slot -> the member's latents (its job, its steps done)
        self._slots = 0

    def add(self, job: InferenceJob) -> int:
        self._slots += 1
        self.members[self._slots] = SimLatents(self.model, job)
        return self._slots

    def step(self) -> dict[int, dict[int, Image.Image]]:
        spec = self.model.spec
        self.model._busy(spec.cpu_ms)
        self.model._wait(spec.device_ms(self.images))
        shown = {}
        for slot, member in self.members.items():
            member.step()
            if previews := member.previews():
                shown[slot] = previews
        return shown

    def steps_done(self, slot: int) -> int:
        return self.members[slot].done

    def total_steps(self, slot: int) -> int:
        return self.members[slot].job.num_inference_steps

    def decode(self, slots: Sequence[int]) -> dict[int, tuple[Image.Image, ...]]:
        jobs = [self.members.pop(slot).job for slot in slots]
        self.model._wait(self.model.spec.decode_ms * sum(job.num_images for job in jobs))
        return {
            slot: tuple(self.model._picture(job.width, job.height, seed) for seed in job.seeds)
            for slot, job in zip(slots, jobs)
        }

    def remove(self, slot: int) -> None:
        self.members.pop(slot, None)

    @property
    def images(self) -> int:
        return sum(member.job.num_images for member in self.members.values())

    def peak_memory_bytes(self) -> int | None:
        return None

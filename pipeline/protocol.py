"""The small contract between the serving layer and a model, free of torch.

The worker and the adapter depend only on this module, so the concurrency layer imports and is
tested without torch; ``pipeline.model`` implements it for diffusers and ``tests/fakes.py`` for tests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from PIL import Image


@dataclass(frozen=True)
class ModelProfile:
    """What the loaded model is and which defaults and limits suit it."""

    name: str
    pipeline_class: str
    scheduler: str
    device: str
    dtype: str
    default_width: int
    default_height: int
    default_steps: int
    default_guidance: float
    min_steps: int = 1
    max_steps: int = 100
    min_guidance: float = 0.0
    max_guidance: float = 20.0
    size_multiple: int = 8
    min_size: int = 64
    max_size: int = 1024
    max_prompt_tokens: int = 75
    supports_negative_prompt: bool = True


@dataclass(frozen=True)
class InferenceJob:
    """One call of the pipeline: one image per entry of ``prompts``/``seeds``.

    A job may carry several requests (dynamic batching): they share size, steps and guidance, and
    each image keeps its own prompt, negative prompt and seed.
    """

    request_id: str
    prompts: tuple[str, ...]
    negative_prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    preview_every: int = 0  # 0: no previews; k: a cheap latent preview every k steps
    preview_images: tuple[int, ...] = (0,)  # which images get previews (the first of each request)

    @property
    def num_images(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class InferenceResult:
    images: tuple[Image.Image, ...]
    steps_done: int
    started: float
    ended: float
    peak_memory_bytes: int | None = None


# on_step(step, total, previews): called on the model thread after every denoising step.
# ``previews`` maps an image index (of ``preview_images``) to a small RGB image approximated from
# the latents (no VAE decode) on the job's preview steps; it is empty on the other steps.
StepCallback = Callable[[int, int, "Mapping[int, Image.Image]"], None]


class Model(Protocol):
    profile: ModelProfile

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in the text encoder, without the start/end tokens. Thread-safe."""
        ...

    def generate(
        self, job: InferenceJob, stop: threading.Event, on_step: StepCallback
    ) -> InferenceResult:
        """Run ``job``; check ``stop`` after every step and raise ``Cancelled`` when it is set."""
        ...

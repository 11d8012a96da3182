"""Every denoising step of one pipeline call: progress, stop and the denoised estimate, for every family.

``StepWatch`` wraps the pipeline's scheduler ``step`` for the duration of one call (an instance
attribute on the model thread's own pipeline, removed afterwards), so it sees every step of every
family the same way: it reports progress, keeps the step's denoised estimate for previews, and
checks stop. diffusers' ``callback_on_step_end`` is not enough: PixArt accepts it and never calls
it (no progress, no cancel), and FLUX hands it packed latents. Stop raises ``StoppedAtStep`` out
of the pipeline's ``__call__``: no more steps and no VAE decode.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from PIL import Image

from ...protocol import InferenceJob, StepCallback, StopFlag
from .previews import Previewer, denoised, unpack


class StoppedAtStep(Exception):
    """Raised inside a step to leave the pipeline's ``__call__`` at once: no more steps, no decode."""


class StepWatch:
    """Progress, stop and previews for one call of ``pipe`` (a context manager)."""

    def __init__(
        self, pipe: Any, job: InferenceJob, stop: StopFlag, on_step: StepCallback, preview_map: Previewer | None
    ) -> None:
        self.pipe = pipe
        self.job = job
        self.stop = stop
        self.on_step = on_step
        self.preview_map = preview_map
        self.steps_done = 0
        self._x0: torch.Tensor | None = None
        self._scheduler: Any = None

    def __enter__(self) -> StepWatch:
        self._scheduler = self.pipe.scheduler
        original = type(self._scheduler).step.__get__(self._scheduler)

        # ``wraps``: the pipeline's ``prepare_extra_step_kwargs`` inspects ``scheduler.step`` for
        # ``generator``; without the original signature an ancestral sampler (Euler a) got none and
        # drew its noise from the global RNG (a seed did not give the same picture twice).
        @functools.wraps(original)
        def step(model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = original(model_output, timestep, sample, *args, **kwargs)
            if self._preview_due(self.steps_done + 1):
                self._x0 = denoised(self._scheduler, out, model_output, timestep, sample)
            self.report()
            return out

        self._scheduler.step = step
        return self

    def __exit__(self, *exc: object) -> None:
        self._scheduler.__dict__.pop("step", None)

    def _total(self) -> int:
        return int(
            getattr(self.pipe, "num_timesteps", 0)
            or len(getattr(self._scheduler, "timesteps", ()))
            or self.job.num_inference_steps
        )

    def _preview_due(self, step: int) -> bool:
        every = self.job.preview_every
        return bool(self.preview_map is not None and every and step % every == 0)

    def report(self) -> None:
        self.steps_done += 1
        total = self._total()
        previews: dict[int, Image.Image] = {}
        if self._preview_due(self.steps_done) and self.steps_done < total and self._x0 is not None:
            assert self.preview_map is not None
            latents = unpack(self.pipe, self._x0, self.job.width, self.job.height)
            for index in self.job.preview_images:
                if index < latents.shape[0] and latents.shape[1] == self.preview_map.channels:
                    previews[index] = self.preview_map.image(latents[index], self.job.width, self.job.height)
        self.on_step(self.steps_done, total, previews)
        if self.stop.is_set():
            raise StoppedAtStep

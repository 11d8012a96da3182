"""A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread.

``DiffusersModel`` implements ``protocol.Model``; it is owned by the engine's model thread and
must only be called from there (``count_tokens`` excepted). ``engine.loading`` builds it.
"""

from __future__ import annotations

import copy
import gc
import threading
import time
from typing import Any

import torch
from PIL import Image

from ..errors import Cancelled, OutOfMemory
from ..protocol import InferenceJob, InferenceResult, ModelProfile, StepCallback, StopFlag


class _Stop(Exception):
    """Raised inside diffusers' step callback to leave ``__call__`` at once: no more steps, no decode."""


# SD 1.x/2.x latent -> RGB approximation (a linear map of the 4 latent channels): a preview for
# the price of a 4x3 matmul, never a VAE decode.
_LATENT_RGB = ((0.298, 0.207, 0.208), (0.187, 0.286, 0.173), (-0.158, 0.189, 0.264), (-0.184, -0.271, -0.473))


def latent_preview(latents: Any, width: int, height: int, index: int = 0) -> Image.Image | None:
    """Image ``index`` of the batch as a rough RGB preview; None for latents of another shape (FLUX packs them)."""
    if latents is None or latents.ndim != 4 or latents.shape[1] != 4 or index >= latents.shape[0]:
        return None
    factors = torch.tensor(_LATENT_RGB, dtype=torch.float32)
    rgb = latents[index].detach().float().cpu().permute(1, 2, 0) @ factors
    array = ((rgb + 1) * 127.5).clamp(0, 255).to(torch.uint8).numpy()
    return Image.fromarray(array, "RGB").resize((width, height), Image.Resampling.BILINEAR)


class DiffusersModel:
    """A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread."""

    def __init__(self, pipe: Any, profile: ModelProfile) -> None:
        self.pipe = pipe
        self.profile = profile
        self._device = profile.device
        # A private copy for prepare-time token counting, so no other thread touches the tokenizer
        # the model thread uses (fast tokenizers raise "Already borrowed" under concurrent use).
        self._count_tokenizer = copy.deepcopy(getattr(pipe, "tokenizer", None))
        self._count_lock = threading.Lock()

    def count_tokens(self, text: str) -> int:
        if self._count_tokenizer is None:
            return 0
        with self._count_lock:
            ids = self._count_tokenizer(text, truncation=False, add_special_tokens=False).input_ids
        return len(ids)

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        pipe = self.pipe
        steps_done = 0

        def callback(_pipe: Any, i: int, _t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            nonlocal steps_done
            steps_done = i + 1
            total = int(getattr(_pipe, "num_timesteps", 0) or job.num_inference_steps)
            previews: dict[int, Image.Image] = {}
            if job.preview_every and (steps_done % job.preview_every == 0) and steps_done < total:
                for index in job.preview_images:
                    preview = latent_preview(kwargs.get("latents"), job.width, job.height, index)
                    if preview is not None:
                        previews[index] = preview
            on_step(steps_done, total, previews)
            if stop.is_set():
                raise _Stop
            return {}

        # 1. Per-image CPU generators: the same seed gives the same noise on any device and batch.
        generators = [torch.Generator("cpu").manual_seed(s) for s in job.seeds]
        kwargs: dict[str, Any] = dict(
            prompt=list(job.prompts),
            width=job.width,
            height=job.height,
            num_inference_steps=job.num_inference_steps,
            guidance_scale=job.guidance_scale,
            generator=generators,
            callback_on_step_end=callback,
            callback_on_step_end_tensor_inputs=["latents"],
        )
        if self.profile.supports_negative_prompt:
            kwargs["negative_prompt"] = list(job.negative_prompts)
        if stop.is_set():
            raise Cancelled(steps_done=0)
        cuda = self._device == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        # 2. Run. An out-of-memory error is turned into OutOfMemory *after* the except block, so
        #    the traceback's frames (and the tensors they hold) are gone before memory is freed.
        oom = False
        started = time.time()
        try:
            with torch.inference_mode():
                images = pipe(**kwargs).images
        except _Stop:
            raise Cancelled(steps_done=steps_done) from None
        except (torch.OutOfMemoryError, MemoryError):
            oom = True
        if oom:
            self.free_memory()
            raise OutOfMemory(job.request_id)
        ended = time.time()
        peak = torch.cuda.max_memory_allocated() if cuda else None
        return InferenceResult(tuple(images), steps_done, started, ended, peak)

    def free_memory(self) -> None:
        gc.collect()
        if self._device == "cuda":
            torch.cuda.empty_cache()

"""The only module that imports torch and diffusers: load a pipeline and run one job on it.

``load_model`` takes the embedded default model, a hub id or a local path and always goes through
``DiffusionPipeline.from_pretrained``. ``DiffusersModel`` implements ``protocol.Model``; it is owned
by the model thread and must only be called from there (``count_tokens`` excepted).
"""

from __future__ import annotations

import copy
import gc
import inspect
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline
from PIL import Image

from .config import Settings
from .default_model import ensure_default_model, model_defaults
from .errors import Cancelled, OutOfMemory
from .protocol import InferenceJob, InferenceResult, ModelProfile, StepCallback
from .zerogpu import on_zero_gpu

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "embedded-default (tiny SD trained on shapes)"

# Few-step distilled models: (pattern on the model id, default steps). They want guidance 0.
_FEW_STEP = ((re.compile(r"sd-?turbo|sdxl-turbo", re.I), 1), (re.compile(r"schnell|lightning|lcm|hyper", re.I), 4))


class _Stop(Exception):
    """Raised inside diffusers' step callback to leave ``__call__`` at once: no more steps, no decode."""


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(requested: str, device: str, pipeline_class: str) -> torch.dtype:
    if requested != "auto":
        return getattr(torch, requested)
    if device == "cpu":
        return torch.float32
    # Flow-matching transformers (FLUX, SD3) are trained in bf16 and overflow in fp16.
    if device == "cuda" and re.search(r"Flux|StableDiffusion3|Sana|Lumina", pipeline_class):
        return torch.bfloat16
    return torch.float16


def _pipeline_class(source: str) -> str:
    index = Path(source) / "model_index.json"
    if index.exists():
        import json

        return str(json.loads(index.read_text()).get("_class_name", ""))
    return ""


def build_profile(pipe: Any, name: str, device: str, dtype: torch.dtype, saved: dict | None = None) -> ModelProfile:
    """Defaults and limits that follow the loaded model (``saved``: defaults written with a model trained here)."""
    scale = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    sample = getattr(getattr(denoiser, "config", None), "sample_size", None)
    if isinstance(sample, (list, tuple)):
        sample = sample[0]
    default_size = int(getattr(pipe, "default_sample_size", None) or sample or 64) * scale
    pipeline_class = type(pipe).__name__
    # Packed-latent transformers (FLUX) need sizes divisible by 2 * the VAE factor.
    multiple = scale * 2 if "Flux" in pipeline_class else scale
    default_size = max(multiple, default_size // multiple * multiple)
    params = inspect.signature(pipe.__call__).parameters
    tokenizer = getattr(pipe, "tokenizer", None)
    max_tokens = int(getattr(tokenizer, "model_max_length", 77) or 77) - 2
    steps, guidance, max_steps, max_guidance = 25, 7.5, 100, 20.0
    if default_size <= 128:  # the tiny embedded model: fast, so a modest default
        steps = 20
    for pattern, few in _FEW_STEP:
        if pattern.search(name):
            steps, guidance, max_steps, max_guidance = few, 0.0, 8, 2.0
            break
    saved = saved or {}
    steps = int(saved.get("steps", steps))
    guidance = float(saved.get("guidance", guidance))
    return ModelProfile(
        name=name,
        pipeline_class=pipeline_class,
        scheduler=type(pipe.scheduler).__name__,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        default_width=default_size,
        default_height=default_size,
        default_steps=steps,
        default_guidance=guidance,
        max_steps=max_steps,
        max_guidance=max_guidance,
        size_multiple=multiple,
        min_size=max(64, multiple),
        max_size=min(2048, max(256, default_size * 2)),
        max_prompt_tokens=max_tokens,
        supports_negative_prompt="negative_prompt" in params,
    )


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

    def generate(self, job: InferenceJob, stop: threading.Event, on_step: StepCallback) -> InferenceResult:
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


def load_model(settings: Settings, *, warmup: bool = True) -> DiffusersModel:
    """Load ``settings.model`` (or the embedded default) through ``from_pretrained``. Runs on the model thread."""
    source = settings.model or str(ensure_default_model())
    name = settings.model or DEFAULT_MODEL_NAME
    device = pick_device(settings.device)
    if device == "cpu":
        torch.set_num_threads(settings.resolved_torch_threads())
    dtype = pick_dtype(settings.dtype, device, _pipeline_class(source))
    t0 = time.time()
    pipe = DiffusionPipeline.from_pretrained(source, dtype=dtype)
    if settings.cpu_offload and device == "cuda":
        pipe.enable_model_cpu_offload()
    else:
        pipe.to(device)
    if settings.attention_slicing:
        pipe.enable_attention_slicing()
    if settings.vae_tiling and hasattr(getattr(pipe, "vae", None), "enable_tiling"):
        pipe.vae.enable_tiling()
    pipe.set_progress_bar_config(disable=True)
    saved = model_defaults(Path(source)) if Path(source).is_dir() else {}
    model = DiffusersModel(pipe, build_profile(pipe, name, device, dtype, saved))
    # On a ZeroGPU Space the GPU function runs under @spaces.GPU; a no-op everywhere else.
    model.generate = on_zero_gpu(model.generate)  # type: ignore[method-assign]
    log.info(
        "loaded %s (%s, %s on %s, %d torch threads) in %.2fs",
        name, model.profile.pipeline_class, model.profile.dtype, device, torch.get_num_threads(), time.time() - t0,
    )
    if warmup:
        _warm_up(model)
    return model


def _warm_up(model: DiffusersModel) -> None:
    """One tiny step, so the first user's request does not pay for lazy initialisation."""
    p = model.profile
    job = InferenceJob("warmup", ("warm up",), ("",), (0,), p.min_size, p.min_size, 1, p.default_guidance)
    t0 = time.time()
    model.generate(job, threading.Event(), lambda *_: None)
    log.info("warm-up took %.2fs", time.time() - t0)

"""Load a diffusers pipeline through ``from_pretrained`` and fit defaults and limits to it.

The only module besides ``diffusers_model`` that imports torch and diffusers. ``load_model`` takes
the embedded default model, a hub id or a local path; it runs on the model thread.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline

from ..config import Settings
from ..default_model import ensure_default_model, model_defaults
from ..protocol import InferenceJob, ModelProfile
from .diffusers_model import DiffusersModel
from .previews import load_preview_map
from .zerogpu import zero_gpu_active

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "embedded-default (tiny SD trained on shapes)"

# Few-step distilled models: (pattern on the model id, default steps). They want guidance 0.
_FEW_STEP = ((re.compile(r"sd-?turbo|sdxl-turbo", re.I), 1), (re.compile(r"schnell|lightning|lcm|hyper", re.I), 4))


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
    folder = Path(source) if Path(source).is_dir() else None
    # Previews: the map saved with the model, else one fitted to its VAE now (not on ZeroGPU, whose
    # device exists only inside a request's GPU call).
    preview_map = load_preview_map(pipe, folder, fit=not zero_gpu_active())
    model = DiffusersModel(pipe, build_profile(pipe, name, device, dtype, saved), preview_map)
    log.info(
        "loaded %s (%s, %s on %s, %d torch threads) in %.2fs",
        name,
        model.profile.pipeline_class,
        model.profile.dtype,
        device,
        torch.get_num_threads(),
        time.time() - t0,
    )
    # On ZeroGPU the device exists only inside a request's GPU call: no warm-up outside one.
    if warmup and not zero_gpu_active():
        _warm_up(model)
    return model


def _warm_up(model: DiffusersModel) -> None:
    """One tiny step, so the first user's request does not pay for lazy initialisation."""
    p = model.profile
    job = InferenceJob("warmup", ("warm up",), ("",), (0,), p.min_size, p.min_size, 1, p.default_guidance)
    t0 = time.time()
    try:
        model.generate(job, threading.Event(), lambda *_: None)
    except Exception:  # a model that cannot warm up may still serve: say so, and carry on
        log.exception("the warm-up step failed; serving anyway")
        return
    log.info("warm-up took %.2fs", time.time() - t0)

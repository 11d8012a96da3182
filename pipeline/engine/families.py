"""Model families: what each diffusers pipeline needs to be served the way diffusers runs it.

A single SD-shaped code path hides the families' differences; here they are read from the loaded
pipeline itself -- its ``__call__`` defaults, its components' configs, its tokenizers -- and from
the few facts diffusers' documentation and the model cards state:

- **Defaults** are the pipeline's own ``__call__`` defaults (SDXL guidance 5.0, SD3 28 steps / 7.0,
  FLUX 28 / 3.5, PixArt 20 / 4.5), except where the configuration says the model is distilled:
  FLUX without guidance embeddings (schnell: 4 steps, no guidance), an LCM/TCD scheduler, or an
  Euler scheduler with "trailing" timesteps and no zero-SNR rescaling (the Turbo / Lightning
  recipes: 1-4 steps, no guidance). The folder name is only a hint for how few.
- **The size step** is the VAE scale factor times the denoiser's patch size; FLUX packs 2x2
  latents, so it needs twice the VAE factor.
- **The negative prompt** is offered where the pipeline uses it at the served settings; FLUX reads
  it only with ``true_cfg_scale > 1`` (twice the compute), so it is not offered there.
- **Text encoders:** CLIP reads 77 tokens (75 of text); T5 reads the family's
  ``max_sequence_length``; the long-prompt note names the encoder that cut the prompt.
- **dtype:** FLUX, SD3, Sana and Lumina are trained in bf16 and overflow in fp16 (black images);
  the SD families and PixArt run in fp16 on a GPU.
- **Samplers:** the UNet families and PixArt offer A1111's Euler, Euler a, DPM++ 2M Karras, DDIM
  and UniPC besides their own; flow-matching and consistency models only their own (``samplers``).
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import samplers

log = logging.getLogger(__name__)

BF16_FAMILIES = ("flux", "sd3", "sana", "lumina")
_FEW_STEP_NAMES = (
    (re.compile(r"sd-?turbo|sdxl-turbo|turbo", re.I), 1),
    (re.compile(r"lightning|lcm|hyper|schnell", re.I), 4),
)


@dataclass(frozen=True)
class FamilyTraits:
    family: str
    default_steps: int
    default_guidance: float
    max_steps: int
    max_guidance: float
    min_steps: int
    size_multiple: int
    negative_prompt: bool
    encoders: tuple[tuple[str, int], ...]  # (encoder, text tokens it reads), in the pipeline's order
    distilled: bool
    schedulers: tuple[str, ...] = ("default",)  # the sampler names offered (engine.samplers)


def family_of(pipeline_class: str) -> str:
    for marker, family in (
        ("Flux", "flux"),
        ("StableDiffusion3", "sd3"),
        ("StableDiffusionXL", "sdxl"),
        ("PixArt", "pixart"),
        ("Sana", "sana"),
        ("Lumina", "lumina"),
        ("StableDiffusion", "sd"),
    ):
        if marker in pipeline_class:
            return family
    return "other"


def pipeline_class_of(source: str) -> str:
    """The pipeline class a folder or hub id holds: its ``model_index.json``, else a guess from the name."""
    index = Path(source) / "model_index.json"
    if index.exists():
        return str(json.loads(index.read_text()).get("_class_name", ""))
    try:  # a hub id, where the hub is reachable (offline this raises at once)
        from diffusers import DiffusionPipeline

        return str(DiffusionPipeline.load_config(source).get("_class_name", ""))
    except Exception:
        pass
    for pattern, cls in (
        (r"flux", "FluxPipeline"),
        (r"stable-diffusion-3|sd3", "StableDiffusion3Pipeline"),
        (r"sana", "SanaPipeline"),
        (r"pixart", "PixArtSigmaPipeline"),
        (r"xl", "StableDiffusionXLPipeline"),
    ):
        if re.search(pattern, source, re.I):
            return cls
    return "StableDiffusionPipeline"


def pick_dtype_name(requested: str, device: str, pipeline_class: str) -> str:
    """``--dtype auto``: float32 on the CPU; bf16 for the families that need it; else fp16 on a GPU."""
    if requested != "auto":
        return requested
    if device == "cpu":
        return "float32"
    if device == "cuda" and family_of(pipeline_class) in BF16_FAMILIES:
        return "bfloat16"
    return "float16"


def _default(params: Any, name: str, fallback: Any) -> Any:
    value = params[name].default if name in params else inspect.Parameter.empty
    return fallback if value in (inspect.Parameter.empty, None) else value


def _encoders(pipe: Any, params: Any) -> tuple[tuple[str, int], ...]:
    max_sequence = int(_default(params, "max_sequence_length", 256))
    found = []
    for attr in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        tokenizer = getattr(pipe, attr, None)
        if tokenizer is None:
            continue
        kind = type(tokenizer).__name__
        if "T5" in kind:
            found.append(("T5", max_sequence - 1))  # the end-of-sequence token takes one
        elif "Gemma" in kind:
            found.append(("Gemma", max_sequence - 1))
        else:
            found.append(("CLIP", int(getattr(tokenizer, "model_max_length", 77) or 77) - 2))
    return tuple(found)


def _turbo_schedule(scheduler: Any) -> bool:
    """SD-Turbo / SDXL-Turbo / Lightning ship an Euler schedule with "trailing" timesteps and an
    epsilon prediction; a zero-terminal-SNR model (trailing too) rescales its betas instead."""
    config = scheduler.config
    return (
        "Euler" in type(scheduler).__name__
        and getattr(config, "timestep_spacing", "") == "trailing"
        and not getattr(config, "rescale_betas_zero_snr", False)
        and getattr(config, "prediction_type", "epsilon") == "epsilon"
    )


def traits(pipe: Any, name: str) -> FamilyTraits:
    """The served defaults and limits of a loaded pipeline (see the module docstring)."""
    cls = type(pipe).__name__
    family = family_of(cls)
    params = inspect.signature(pipe.__call__).parameters
    steps = int(_default(params, "num_inference_steps", 25))
    guidance = float(_default(params, "guidance_scale", 7.5))
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    config = getattr(denoiser, "config", None)
    scheduler = pipe.scheduler
    few: int | None = None
    if family == "flux" and not getattr(config, "guidance_embeds", True):
        few = 4  # schnell: timestep-distilled, no guidance embedding
    elif type(scheduler).__name__ in ("LCMScheduler", "TCDScheduler") or _turbo_schedule(scheduler):
        few = 4
    if few is not None:
        few = next((n for pattern, n in _FEW_STEP_NAMES if pattern.search(name)), few)
        steps, guidance = few, 0.0
    scale = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    patch = int(getattr(config, "patch_size", 1) or 1)
    multiple = scale * 2 if family == "flux" else scale * patch
    return FamilyTraits(
        family=family,
        default_steps=steps,
        default_guidance=guidance,
        max_steps=8 if few is not None else 100,
        max_guidance=2.0 if few is not None else 20.0,
        min_steps=2 if family == "pixart" else 1,  # PixArt's own scheduler fails a 1-step run
        size_multiple=multiple,
        negative_prompt="negative_prompt" in params and family != "flux",
        encoders=_encoders(pipe, params),
        distilled=few is not None,
        schedulers=samplers.offered(family, scheduler),
    )


def call_arguments(family: str, negative_prompts: tuple[str, ...], negative_prompt: bool) -> dict[str, Any]:
    """The negative prompt as diffusers expects it: SDXL zeroes the unconditional embedding only for
    ``None`` (``force_zeros_for_empty_prompt``), so an all-empty negative is sent as ``None`` there."""
    if not negative_prompt:
        return {}
    if family == "sdxl" and not any(negative_prompts):
        return {"negative_prompt": None}
    return {"negative_prompt": list(negative_prompts)}

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
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import samplers
from .family_table import Family, family_for

log = logging.getLogger(__name__)

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
    samplers: tuple[str, ...] = ("default",)  # the sampler names offered (engine.model.samplers)
    guidance_kind: str = "cfg"  # family_table's guidance kinds
    cfg_above: float = 1.0  # CFG, and with it the negative prompt, runs above this guidance
    guidance_arg: str | None = "guidance_scale"  # the __call__ argument the guidance control drives
    output: str = "images"  # the output's attribute holding the pictures
    fixed: dict[str, Any] = field(default_factory=dict)  # arguments every call carries
    step_choices: tuple[int, ...] = ()  # only these step counts run (empty: the whole range)
    size_choices: tuple[tuple[int, int], ...] = ()  # only these sizes are drawn as asked (empty: any on the grid)
    default_size: int = 512
    negative_reason: str = ""  # why the negative prompt is not offered
    previews: bool = True
    guessed: tuple[str, ...] = ()  # for a class the registry does not know: the traits guessed


def family_of(pipeline_class: str) -> str:
    """The family of exactly this class (``family_table``); ``"other"`` for a class it does not know."""
    entry = family_for(pipeline_class)
    return entry.key if entry else "other"


def pipeline_class_of(source: str) -> str:
    """The pipeline class a folder or hub id holds: its ``model_index.json``, else a guess from the name."""
    index = Path(source) / "model_index.json"
    if index.exists():
        return str(json.loads(index.read_text()).get("_class_name", ""))
    if (Path(source) / "modular_model_index.json").exists():  # a ModularPipeline folder (``modular``)
        return str(json.loads((Path(source) / "modular_model_index.json").read_text()).get("_class_name", ""))
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
    entry = family_for(pipeline_class)
    if device == "cuda" and (entry.bf16 if entry else "StableDiffusion" not in pipeline_class):
        return "bfloat16"
    return "float16"


def _default(params: Any, name: str, fallback: Any) -> Any:
    value = params[name].default if name in params else inspect.Parameter.empty
    return fallback if value in (inspect.Parameter.empty, None) else value


# Tokenizer class name -> the encoder's name in notes. LLM encoders read ``max_sequence_length``
# tokens of the prompt; T5 as many less its end-of-sequence token; CLIP its 77 less two.
_ENCODER_NAMES = (("ByT5", "ByT5"), ("T5", "T5"), ("Gemma", "Gemma"), ("Llama", "Llama"), ("Qwen", "Qwen"),
                  ("Mistral", "Mistral"), ("Pixtral", "Mistral"), ("GLM", "GLM"), ("Glm", "GLM"))  # fmt: skip
_TOKENIZER_ATTRS = ("tokenizer", "tokenizer_2", "tokenizer_3", "tokenizer_4")


def inner_tokenizer(tokenizer: Any) -> Any:
    """A processor's tokenizer (Qwen2VLProcessor, PixtralProcessor), or the tokenizer itself."""
    return getattr(tokenizer, "tokenizer", None) or tokenizer


def encoder_tokenizers(pipe: Any) -> list[tuple[str, int, Any]]:
    """(encoder name, prompt tokens it reads, its tokenizer), in the pipeline's order."""
    params = inspect.signature(pipe.__call__).parameters
    max_sequence = int(_default(params, "max_sequence_length", 256))
    found = []
    for attr in _TOKENIZER_ATTRS:
        tokenizer = getattr(pipe, attr, None)
        if tokenizer is None:
            continue
        inner = inner_tokenizer(tokenizer)
        kind = type(inner).__name__
        name = next((label for marker, label in _ENCODER_NAMES if marker in kind), "CLIP" if "CLIP" in kind else kind)
        if name in ("T5", "ByT5", "Gemma"):
            found.append((name, max_sequence - 1, inner))  # the end-of-sequence token takes one
        elif name == "CLIP":
            found.append(("CLIP", int(getattr(inner, "model_max_length", 77) or 77) - 2, inner))
        else:
            window = max_sequence if "max_sequence_length" in params else getattr(inner, "model_max_length", 512)
            found.append((name, int(min(window, 10**6)), inner))
    family = family_for(type(pipe).__name__)
    for i, (name, window) in enumerate(family.encoders if family else ()):
        if i < len(found):
            found[i] = (name, found[i][1] if window is None else window, found[i][2])
    return found


def counted_text(encoder: str, text: str) -> str:
    """What of ``text`` the encoder reads: a ByT5 glyph encoder (HunyuanImage) only the quoted text,
    formatted as the pipeline's ``extract_glyph_text`` formats it; every other encoder all of it."""
    if encoder != "ByT5":
        return text
    from diffusers.pipelines.hunyuan_image.pipeline_hunyuanimage import extract_glyph_text

    return extract_glyph_text(text) or ""


def _encoders(pipe: Any) -> tuple[tuple[str, int], ...]:
    """One window per encoder name (HiDream's two CLIPs read the same 75)."""
    return tuple({name: window for name, window, _ in encoder_tokenizers(pipe)}.items())


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


_FEW_STEP_SCHEDULERS = ("LCMScheduler", "TCDScheduler", "SCMScheduler")


def _denoiser_config(pipe: Any) -> Any:
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    return getattr(denoiser, "config", None)


def _spatial_patch(config: Any) -> int:
    """The denoiser's spatial patch size: an int, or the last of a (t, h, w) / (h, w) tuple."""
    patch = getattr(config, "patch_size", None) or 1
    if isinstance(patch, (list, tuple)):
        patch = patch[-1]
    return int(patch)


def size_step(pipe: Any, family: Family | None) -> int:
    """What width and height must be multiples of: the VAE factor x the patch size x any 2x2 packing,
    and the pipeline's own image processor's factor (which several pipelines set to exactly that)."""
    vae = int(getattr(pipe, "vae_scale_factor", None) or getattr(pipe, "vae_scale_factor_spatial", None) or 8)
    packing = family.packing if family else 1
    step = vae * max(_spatial_patch(_denoiser_config(pipe)), packing)  # a packed model's patch is the packing
    processor = getattr(getattr(getattr(pipe, "image_processor", None), "config", None), "vae_scale_factor", None)
    if isinstance(processor, int) and processor > 0:
        step = math.lcm(step, processor)
    return step


def _distilled(pipe: Any, family: Family | None) -> bool:
    """Config markers of a step- or guidance-distilled model (never its name alone)."""
    flag = getattr(getattr(pipe, "config", None), "is_distilled", None)
    if flag is not None:
        return bool(flag)
    config = _denoiser_config(pipe)
    if family is not None and family.key == "flux" and not getattr(config, "guidance_embeds", True):
        return True  # schnell: timestep-distilled, no guidance embedding
    scheduler = pipe.scheduler
    return type(scheduler).__name__ in _FEW_STEP_SCHEDULERS or _turbo_schedule(scheduler)


def _guidance_kind(pipe: Any, family: Family | None, params: Any, distilled: bool) -> str:
    if family is None:  # generic: the arguments the signature has
        if "true_cfg_scale" in params:
            return "true_cfg"
        return "cfg" if "guidance_scale" in params else "none"
    kind = family.guidance
    if getattr(_denoiser_config(pipe), "time_cond_proj_dim", None) is not None:
        return "embedded"  # an LCM UNet reads guidance through its time embedding, with no CFG
    if distilled and kind in ("embedded", "cfg") and family.key in ("flux", "flux2-klein", "krea2"):
        return "distilled"  # schnell, klein, Krea 2 turbo: guidance baked in
    return kind


_GUIDANCE_ARG = {"cfg": "guidance_scale", "embedded": "guidance_scale", "schedule": "guidance_scale",
                 "true_cfg": "true_cfg_scale", "guider": "guidance_scale"}  # fmt: skip


def _default_size(pipe: Any, family: Family | None, params: Any, step: int) -> int:
    """The size ``__call__`` draws when none is given: its signature default, else the pipeline's
    ``default_sample_size`` x its VAE factor, else the family's, else the denoiser's ``sample_size``."""
    size = params["height"].default if "height" in params else None
    if not isinstance(size, int):
        vae = int(getattr(pipe, "vae_scale_factor", None) or getattr(pipe, "vae_scale_factor_spatial", None) or 8)
        sample = getattr(pipe, "default_sample_size", None)
        if isinstance(sample, int) and sample > 0:
            size = sample * vae
        elif family is not None and family.default_size:
            size = family.default_size
        else:
            configured = getattr(_denoiser_config(pipe), "sample_size", None) or 64
            if isinstance(configured, (list, tuple)):
                configured = configured[-1]
            size = int(configured) * vae
    return max(step, int(size) // step * step)


def traits(pipe: Any, name: str) -> FamilyTraits:
    """The served defaults and limits of a loaded pipeline (see the module docstring)."""
    cls = type(pipe).__name__
    family = family_for(cls)
    params = inspect.signature(pipe.__call__).parameters
    distilled = _distilled(pipe, family)
    kind = _guidance_kind(pipe, family, params, distilled)
    arg = _GUIDANCE_ARG.get(kind)
    steps = int(_default(params, "num_inference_steps", 25))
    if kind == "guider":  # the scale is the guider component's
        guidance = float(getattr(getattr(pipe, "guider", None), "guidance_scale", 5.0))
    elif kind == "schedule":
        schedule = _default(params, "guidance_schedule", (7.5,))
        guidance = float(max(schedule))
    else:
        guidance = float(_default(params, arg, 7.5)) if arg else 0.0
    card = next((c for c in (family.cards if family else ()) if c.matches(name) and (distilled or c.by_name)), None)
    max_steps, max_guidance = 100, family.max_guidance if family else 20.0
    if distilled or card is not None:
        steps = card.steps if card else 4
        if kind == "cfg":  # a distilled model without CFG at its served guidance
            guidance = card.guidance if card else 0.0
            max_guidance = 2.0 if guidance <= 1 else max_guidance
        elif kind == "distilled":
            guidance = 0.0
        elif card is not None:
            guidance = card.guidance
        elif kind == "embedded" and family is not None and family.key in ("sd", "sdxl"):
            guidance = 8.0  # an LCM UNet (lcm-sdxl's card: 4 steps, guidance 8 through the embedding)
        max_steps = 8 if distilled else max_steps
    if kind in ("distilled", "none"):
        arg, guidance, max_guidance = None, 0.0, 0.0
    step_choices = family.step_choices if family else ()
    cfg_above = family.cfg_above if family else 1.0
    negative, reason = _negative_prompt(params, kind, guidance, cfg_above)
    guessed: tuple[str, ...] = ()
    if family is None:
        guessed = ("guidance: " + (arg or "none"), "negative prompt: " + ("yes" if negative else "no"),
                   "output: images", "job-level batching")  # fmt: skip
    step = size_step(pipe, family)
    return FamilyTraits(
        family=family.key if family else "other",
        default_steps=steps,
        default_guidance=guidance,
        max_steps=max(step_choices) if step_choices else max_steps,
        max_guidance=max_guidance,
        min_steps=min(step_choices) if step_choices else (family.min_steps if family else 1),
        size_multiple=step,
        negative_prompt=negative,
        encoders=_encoders(pipe),
        distilled=distilled,
        samplers=samplers.offered(family.key if family and family.samplers else "other", pipe.scheduler),
        guidance_kind=kind,
        cfg_above=cfg_above,
        guidance_arg=arg,
        output=family.output if family else "images",
        fixed=dict(family.fixed) if family else {},
        step_choices=step_choices,
        size_choices=family.size_choices if family else (),
        default_size=_default_size(pipe, family, params, step),
        negative_reason=reason,
        previews=family.previews if family else True,
        guessed=guessed,
    )


def _negative_prompt(params: Any, kind: str, guidance: float, cfg_above: float = 1.0) -> tuple[bool, str]:
    """Whether the negative prompt is offered at the served settings, and if not, why."""
    if "negative_prompt" not in params:
        return False, "this model's pipeline takes no negative prompt"
    if kind not in ("cfg", "true_cfg", "schedule", "guider"):
        return False, "this model is guidance-distilled: it has no unconditional branch for a negative prompt to steer"
    if guidance <= cfg_above:
        return (
            False,
            f"this model runs without classifier-free guidance (guidance {cfg_above:g} or less): no negative prompt",
        )
    return True, ""


def call_default(pipe: Any, name: str, fallback: Any) -> Any:
    """A default of the pipeline's own ``__call__`` (``max_sequence_length``: 512 FLUX, 256 SD3)."""
    parameter = inspect.signature(pipe.__call__).parameters.get(name)
    return fallback if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def call_arguments(
    family: str, negative_prompts: tuple[str, ...], negative_prompt: bool, guidance_kind: str = "cfg"
) -> dict[str, Any]:
    """The negative prompt as diffusers expects it: SDXL zeroes the unconditional embedding only for
    ``None`` (``force_zeros_for_empty_prompt``), so an all-empty negative is sent as ``None`` there;
    Qwen-Image runs its unconditional branch only when a negative prompt is sent, so an empty one is
    sent as a space (what its model card's examples send)."""
    if not negative_prompt:
        return {}
    if family == "sdxl" and not any(negative_prompts):
        return {"negative_prompt": None}
    if guidance_kind == "true_cfg":
        return {"negative_prompt": [n or " " for n in negative_prompts]}
    return {"negative_prompt": list(negative_prompts)}


def guidance_arguments(t: FamilyTraits, guidance: float, steps: int = 0) -> dict[str, Any]:
    """The guidance control, sent as the parameter the family reads (see ``family_table``), and the
    arguments the family's step count needs (Sana Sprint's intermediate timestep exists only at 2 steps)."""
    out: dict[str, Any] = dict(t.fixed)
    if t.guidance_arg is not None and t.guidance_kind != "guider":
        out[t.guidance_arg] = guidance
    if t.family == "sana-sprint" and steps != 2:
        out["intermediate_timesteps"] = None
    return out

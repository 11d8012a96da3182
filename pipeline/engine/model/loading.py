"""Load a diffusers pipeline through ``from_pretrained`` and fit defaults and limits to it.

The only module besides ``diffusers_model`` that imports torch and diffusers. ``load_model`` takes
the embedded default model, a hub id or a local path; it runs on the model thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ...config import Settings
from ...controls import ControlSpec
from ...default_model import CONTROL_NAME, DEFAULT_CONTROL_DIR, ensure_default_model, model_defaults
from ...errors import ModelRefused
from ...fields import STEP_CACHE_METHODS
from ...protocol import InferenceJob, InferenceResult, ModelProfile, Submission
from ..hosting.zerogpu import zero_gpu_active
from ..loop.control import loopable
from ..loop.joining import LoopDriver, in_a_loop
from ..loop.loop_base import IMAGE_LOOPS, MIXED_LORA_LOOPS, loop_kind
from .controls import CONTROL_LOOPS, control_modes, fits_family, load_controlnets, offload_controlnets
from .diffusers_model import DiffusersModel
from .families import pick_dtype_name, pipeline_class_of, traits
from .lora import LoadedLoras, fitting_loras, load_loras
from .modes import mode_pipelines
from .previews import Previewer, load_decoder, load_preview_map
from .shelf import ModelShelf, model_hash
from .simulated import PREFIX as SIM_PREFIX
from .simulated import SimSpec, SimulatedModel
from .speedups import compile_denoiser, uncompile_denoiser, use_channels_last
from .text_to_image import load_text_to_image

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "embedded-default (tiny SD trained on shapes)"


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(requested: str, device: str, pipeline_class: str) -> torch.dtype:
    """See ``families.pick_dtype_name``: bf16 for FLUX, SD3 and Sana on a GPU, fp16 for the rest."""
    return getattr(torch, pick_dtype_name(requested, device, pipeline_class))


_LOADS = 0  # models this process has loaded (a LoRA switch never adds one)


def lora_batching(pipe: Any, loras: LoadedLoras | None, setting: str, device: str = "cpu") -> str:
    """How requests with different adapters batch: "mixed" (a loop's denoiser call with a LoRA per
    row) or "separate" (a loop per adapter and scale).

    ``auto``: mixed on a GPU, where a batch's rows cost far less than calls of their own; separate
    on the CPU, where a batch costs its rows and the mixed forward's sub-batches add to it
    (``bench.lora`` on 2 cores: mixed / separate 0.98 in images/s, p99 the same)."""
    if loras is None or loras.hotswap or loop_kind(pipe) not in MIXED_LORA_LOOPS:
        return "separate"
    if setting == "auto":
        return "separate" if device == "cpu" else "mixed"
    return setting


def step_caches(kind: str | None, loras: Any) -> tuple[str, ...]:
    """The step-cache methods a loop family runs per member: the schedule-based ones in every loop,
    First-Block Cache per row in FLUX.1's, Chroma's, Qwen-Image's and Z-Image's (whose forwards
    ``loop_flow.flux_rows``, ``chroma_rows``, ``z_image_rows`` and ``loop_qwen.qwen_rows`` run; its rows shrink
    inside the forward, which peft's per-row adapters would not follow, so not beside --lora)."""
    if kind is None:
        return ()
    rows = ("fbcache",) if kind in ("flux", "chroma", "qwen-image", "z-image") and loras is None else ()
    return (*(m for m in STEP_CACHE_METHODS if m != "fbcache"), *rows)


def build_profile(
    pipe: Any,
    name: str,
    device: str,
    dtype: torch.dtype,
    saved: dict | None = None,
    loras: LoadedLoras | None = None,
    batching: str = "separate",
) -> ModelProfile:
    """Defaults and limits that follow the loaded model (``saved``: defaults written with a model trained here)."""
    t = traits(pipe, name)
    default_size = t.default_size
    sizes = [n for size in t.size_choices for n in size]
    saved = saved or {}
    return ModelProfile(
        name=name,
        pipeline_class=type(pipe).__name__,
        sampler=type(pipe.scheduler).__name__,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        default_width=default_size,
        default_height=default_size,
        default_steps=int(saved.get("steps", t.default_steps)),
        default_guidance=float(saved.get("guidance", t.default_guidance)),
        min_steps=t.min_steps,
        max_steps=t.max_steps,
        max_guidance=t.max_guidance,
        size_multiple=t.size_multiple,
        min_size=min(sizes) if sizes else max(64, t.size_multiple),
        max_size=max(sizes) if sizes else min(2048, max(256, default_size * 2)),
        text_encoders=t.encoders or (("CLIP", 75),),
        supports_negative_prompt=t.negative_prompt,
        family=t.family,
        samplers=t.samplers,
        step_joining=loop_kind(pipe) is not None,  # SD 1.x/2.x, FLUX, SD3, Chroma, Z-Image, Qwen-Image
        step_caches=step_caches(loop_kind(pipe), loras),  # per member, in its loops (issue 50)
        guidance_arg=t.guidance_arg,
        step_choices=t.step_choices,
        size_choices=t.size_choices,
        negative_prompt_reason=t.negative_reason,
        previews=t.previews,
        cfg_above=t.cfg_above,
        loras=loras.infos if loras is not None else (),
        lora_batching=batching,
    )


def load_model(settings: Settings, *, warmup: bool = True) -> DiffusersModel | SimulatedModel | ModelShelf:
    """Load ``settings.model`` (or the embedded default) through ``from_pretrained``; with several
    ``--model``, each of them onto one ``ModelShelf`` (issue 52). Runs on the model thread."""
    specs = settings.model_specs()
    if len(specs) == 1 and not specs[0].named:
        return load_one(settings, warmup=warmup)
    budget = settings.device_memory_budget
    device = pick_device(settings.device)
    shelf = ModelShelf(device=device, budget=None if budget is None else int(budget * 2**20),
                       offloaded=settings.cpu_offload and device == "cuda")  # fmt: skip
    if settings.compile and device == "cuda":
        log.warning("--compile with several models: a model moved off the device and back records its CUDA graphs "
                    "again; a --device-memory-budget that holds every model avoids the moves")  # fmt: skip
    for spec in specs:
        title = DEFAULT_MODEL_NAME if spec.source is None else spec.source
        if spec.name != title.split(" (", 1)[0]:
            title = f"{spec.name} ({title})"
        shelf.before_load()  # on a GPU: the models so far to CPU memory, so this one loads beside none of them
        shelf.add(spec.name, load_one(settings.one_model(spec), warmup=warmup, title=title, several=True))
    shelf.ready(shelf.default)  # the default on the device first, the rest as the budget allows
    return shelf


def load_one(
    settings: Settings, *, warmup: bool = True, title: str | None = None, several: bool = False
) -> DiffusersModel | SimulatedModel:
    """One model (``title``: its name; ``several``: beside others, so each ``--lora`` and
    ``--controlnet`` loads where it fits, and only there)."""
    if settings.model and settings.model.startswith(SIM_PREFIX):  # a benchmark's simulated device
        if settings.loras or settings.controlnets:
            flag = "--lora" if settings.loras else "--controlnet"
            raise ModelRefused(f"{flag} needs a diffusers pipeline; {settings.model} has no layers to adapt")
        return SimulatedModel(SimSpec.parse(settings.model), title or settings.model)
    source = settings.model or str(ensure_default_model())
    name = title or settings.model or DEFAULT_MODEL_NAME
    device = pick_device(settings.device)
    if device == "cpu":
        torch.set_num_threads(settings.resolved_torch_threads())
    dtype = pick_dtype(settings.dtype, device, pipeline_class_of(source))
    t0 = time.time()
    pipe = load_text_to_image(source, dtype)
    if settings.cpu_offload and device == "cuda":
        pipe.enable_model_cpu_offload()
    else:
        pipe.to(device)
    if settings.attention_slicing:
        pipe.enable_attention_slicing()
    if settings.vae_tiling and hasattr(getattr(pipe, "vae", None), "enable_tiling"):
        pipe.vae.enable_tiling()
    pipe.set_progress_bar_config(disable=True)
    if settings.channels_last:  # the weights are on their device in their dtype; before any compile
        use_channels_last(pipe)
    saved = model_defaults(Path(source)) if Path(source).is_dir() else {}
    folder = Path(source) if Path(source).is_dir() else None
    # Previews: the map saved with the model, else one fitted to its VAE now (not on ZeroGPU, whose
    # device exists only inside a request's GPU call).
    preview_off = ""
    if settings.preview_decoder is not None:  # a tiny autoencoder the user chose for sharper previews
        preview_map: Previewer | None = load_decoder(settings.preview_decoder, device, dtype)
    else:
        preview_map, preview_off = load_preview_map(pipe, folder, fit=not zero_gpu_active())
    # LoRAs, once, before any compile (hotswap under --compile, so a switch never recompiles).
    hotswap = settings.compile and not zero_gpu_active()
    lora_specs = fitting_loras(pipe, settings.lora_specs(), name) if several else settings.lora_specs()
    loras = load_loras(pipe, lora_specs, hotswap=hotswap)
    batching = lora_batching(pipe, loras, settings.lora_batching, device)
    profile = build_profile(pipe, name, device, dtype, saved, loras, batching)
    modes, unserved = mode_pipelines(pipe)  # the same components: no second load
    profile = dataclasses.replace(profile, modes=("text", *modes), mode_notes=tuple(unserved.items()))
    if profile.step_joining and "image" in modes and loop_kind(pipe) in IMAGE_LOOPS:
        profile = dataclasses.replace(profile, loop_modes=("text", "image"))
    if not profile.previews:
        preview_map, preview_off = None, "this family's latents cannot be previewed (engine/model/family_table.py)"
    if preview_off:
        log.warning("live previews are off for %s: %s", name, preview_off)
        profile = dataclasses.replace(profile, previews=False, preview_note=preview_off)
    # ControlNets (issue 51), each checked against the family, beside the model on its device.
    specs = settings.control_specs()
    if not specs and settings.model is None and (DEFAULT_CONTROL_DIR / "config.json").exists():
        specs = (ControlSpec(CONTROL_NAME, str(DEFAULT_CONTROL_DIR)),)  # the embedded model's own, trained here
    offloaded = settings.cpu_offload and device == "cuda"
    if several:  # beside other models: each ControlNet where it fits the family
        specs = tuple(s for s in specs if fits_family(s, profile.family))
    controlnets = load_controlnets(specs, pipe, profile.family, "cpu" if offloaded else device, dtype)
    profile = dataclasses.replace(profile, controls=tuple(controlnets),
                                  control_modes=control_modes(pipe, profile.modes, controlnets))  # fmt: skip
    kind = loop_kind(pipe)
    if controlnets and profile.step_joining and kind in CONTROL_LOOPS and (kind != "flux" or loopable(controlnets)):
        profile = dataclasses.replace(profile, loop_modes=(*profile.loop_modes, "control"))  # one per member
    profile = dataclasses.replace(profile, hash=model_hash(folder))
    model = DiffusersModel(pipe, profile, preview_map, loras, modes, controlnets)
    if offloaded:  # in CPU memory, on the device when they run
        model.control_hooks = offload_controlnets(controlnets, device)
    global _LOADS
    _LOADS += 1
    model.loads = _LOADS
    if model.traits.guessed:
        log.info(
            "%s is not in the family registry (engine/model/family_table.py): served generically from its "
            "__call__ signature; guessed %s",
            type(pipe).__name__,
            "; ".join(model.traits.guessed),
        )
    # Compiled last: the profile and previews read the eager modules (an OptimizedModule has no truth
    # value: ``pipe.unet or pipe.transformer`` raises on it).
    compiled = False
    if settings.compile and zero_gpu_active():  # each GPU call is a fresh fork: its compiled code would die with it
        log.warning("--compile is ignored on ZeroGPU (every GPU call would compile again)")
    elif settings.compile:
        offloaded = settings.cpu_offload and device == "cuda"
        compiled = compile_denoiser(pipe, device, offloaded=offloaded) is not None
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
        _warm_up(model, compiled=compiled, step_joining=settings.step_joining == "on")
    return model


def _draw_once(model: DiffusersModel, job: InferenceJob, *, through_loop: bool) -> None:
    """``job`` as one call, or (``through_loop``, where the family has a step-level loop) through the
    loop the served jobs take: its denoiser call differs (a timestep per row), so a compiled warm-up
    must make that call to compile the graph the loop will use."""
    joinable = dataclasses.replace(job, joinable=True, loop_id=1)
    if not through_loop or not in_a_loop(model, joinable):
        model.generate(job, threading.Event(), lambda *_: None)
        return
    ended: list[Any] = []
    warm = Submission(joinable, threading.Event(), ended.append)
    LoopDriver(model.open_loop(joinable), lambda: None).run(warm)
    if isinstance(ended[-1], InferenceResult) and not ended[-1].ok:
        raise RuntimeError(f"the warm-up through the step-level loop failed: {ended[-1].message}")


def _warm_up(model: DiffusersModel, *, compiled: bool = False, step_joining: bool = True) -> None:
    """One step, so the first user's request does not pay for lazy initialisation.

    Uncompiled: one tiny image. Compiled: one image of the default size and guidance, the shape
    most requests have, through the step-level loop where requests run in one (``_draw_once``), so
    this call compiles the graph they will use; its batch is dynamic (``speedups.dynamic_batch``),
    so members joining and leaving compile nothing more. Where the loops run ControlNets (issue 51), a
    second call with a (black) map compiles the denoiser's call with their residuals too. If compiling
    fails, the denoiser goes back to eager and the warm-up runs again: the model still serves.
    """
    p = model.profile  # the family's fewest valid steps (PixArt's scheduler fails a 1-step run)
    width, height = (p.default_width, p.default_height) if compiled else (p.min_size, p.min_size)
    job = InferenceJob("warmup", ("warm up",), ("",), (0,), width, height, p.min_steps, p.default_guidance)
    if compiled:
        log.info(
            "warm-up: the first call compiles the denoiser (%dx%d, guidance %g); this takes a while",
            width,
            height,
            p.default_guidance,
        )
    t0 = time.time()
    try:
        _draw_once(model, job, through_loop=compiled and step_joining)
        if compiled and step_joining and "control" in p.loop_modes:  # the denoiser's call with ControlNet residuals
            black = Image.new("RGB", (width, height))
            control = (("control", p.controls[0]),)
            _draw_once(model, dataclasses.replace(job, options=control, controls=(black,)), through_loop=True)
    except Exception as exc:  # a model that cannot warm up may still serve: say so, and carry on
        if model.traits.guessed:  # an unknown class that the generic call cannot drive: refused now
            raise ModelRefused(
                f"{model.profile.pipeline_class} is not in the family registry and cannot be called the "
                f"generic way (prompt, width, height, num_inference_steps, guidance): {exc}"
            ) from exc
        if compiled and uncompile_denoiser(model.pipe):
            log.exception("the compiled warm-up failed; the denoiser runs eagerly instead")
            _warm_up(model)
            return
        log.exception("the warm-up step failed; serving anyway")
        return
    log.info("warm-up%s took %.2fs", " (compiling)" if compiled else "", time.time() - t0)

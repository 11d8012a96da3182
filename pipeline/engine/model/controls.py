"""ControlNets beside the model (issue 51): loaded at start by name, checked against the family, and
the ControlNet pipeline of each mode for whole calls (``from_pipe``: the loaded components, no new
memory but the ControlNet's).

Which class fits which family (diffusers 0.42): SD 1.x/2.x and SDXL ``ControlNetModel`` (SDXL also
``ControlNetUnionModel``), SD3 ``SD3ControlNetModel``, FLUX.1 ``FluxControlNetModel``, Qwen-Image
``QwenImageControlNetModel``, Z-Image ``ZImageControlNetModel``; a ``ControlNetModel`` must also match
the UNet's cross-attention width and block layout. Anything else stops the start, by name. Step-level
loops run the ControlNet per member in the SD 1.x/2.x and FLUX.1 loops (``engine.loop.control``; FLUX.1's
where its ControlNets share their block counts); elsewhere a request with a control runs as a whole call
of the family's ControlNet pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...controls import ControlSpec
from ...errors import ModelRefused
from ...protocol import InferenceJob

CLASSES: dict[str, tuple[str, ...]] = {
    "sd": ("ControlNetModel",),
    "sdxl": ("ControlNetModel", "ControlNetUnionModel"),
    "sd3": ("SD3ControlNetModel",),
    "flux": ("FluxControlNetModel",),
    "qwen-image": ("QwenImageControlNetModel",),
    "z-image": ("ZImageControlNetModel",),
}
CONTROL_LOOPS = frozenset({"sd", "flux"})  # loops that run a ControlNet per member (``engine.loop.control``)


def class_of(source: str) -> str:
    """The ControlNet class its ``config.json`` names (a local folder; a hub id: downloaded config)."""
    folder = Path(source)
    if folder.is_dir():
        config = json.loads((folder / "config.json").read_text())
    else:
        from huggingface_hub import hf_hub_download

        config = json.loads(Path(hf_hub_download(source, "config.json")).read_text())
    return str(config.get("_class_name", ""))


def fits_family(spec: ControlSpec, family: str) -> bool:
    """Whether the ControlNet's class is one the family's ControlNet pipelines take (several models:
    each ``--controlnet`` loads beside the models it fits)."""
    return class_of(spec.source) in CLASSES.get(family, ())


def load_controlnets(specs: tuple[ControlSpec, ...], pipe: Any, family: str, device: str, dtype: Any) -> dict[str, Any]:
    """Each ``--controlnet`` through its class's ``from_pretrained``, on the model's device and dtype;
    ``ModelRefused`` naming the one that does not fit the model."""
    import diffusers

    loaded: dict[str, Any] = {}
    for spec in specs:
        cls = class_of(spec.source)
        fits = CLASSES.get(family, ())
        if cls not in fits:
            offered = ", ".join(fits) or f"none: diffusers has no ControlNet pipeline for {type(pipe).__name__}"
            raise ModelRefused(f"--controlnet {spec.name}: a {cls or 'model of no known class'} does not fit "
                               f"{type(pipe).__name__} (family {family}; it takes {offered})")  # fmt: skip
        model = getattr(diffusers, cls).from_pretrained(spec.source, torch_dtype=dtype)
        unet = getattr(pipe, "unet", None)
        if cls == "ControlNetModel" and unet is not None:
            ours, theirs = unet.config, model.config
            for key in ("cross_attention_dim", "block_out_channels", "in_channels", "addition_embed_type"):
                if ours.get(key) != theirs.get(key):
                    why = f"its {key} {theirs.get(key)!r} is not the model's UNet's ({ours.get(key)!r})"
                    raise ModelRefused(f"--controlnet {spec.name}: {why}: it was trained for another model")
        loaded[spec.name] = model.to(device).eval()
    return loaded


def offload_controlnets(controlnets: dict[str, Any], device: Any) -> list[Any]:
    """Under ``--cpu-offload``: each ControlNet kept in CPU memory and moved to the device when it runs, as
    diffusers' own offload does with a component outside its chain (``cpu_offload_with_hook``): on the
    device beside the denoiser during the steps, as in the family's ControlNet pipeline's call. The hooks,
    for ``DiffusersModel.control_hooks``: off the device with every other component (the loops'
    ``_offload_all``) and after each whole call."""
    from accelerate import cpu_offload_with_hook  # type: ignore[import-untyped]

    return [cpu_offload_with_hook(net, device)[1] for net in controlnets.values()]


def settings_of(job: InferenceJob) -> tuple[str, float, float, float]:
    """(name, scale, start, end) of the job's control ("none": no control)."""
    options = dict(job.options)
    return (str(options.get("control", "none")), float(options.get("control_scale", 1.0)),
            float(options.get("control_start", 0.0)), float(options.get("control_end", 1.0)))  # fmt: skip


def acting(job: InferenceJob) -> str:
    """The job's ControlNet where it acts on some step, else "none": weight 0, or a window that ends where
    it starts (which diffusers' pipelines refuse), draws as without it (``MemberControl.now``)."""
    name, scale, start, end = settings_of(job)
    return name if name != "none" and scale != 0.0 and end > start else "none"


def control_pipeline(pipe: Any, mode: str, controlnet: Any) -> Any:
    """The family's ControlNet pipeline of ``mode`` over ``pipe``'s components (``AutoPipelineFor*.from_pipe``)."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting, AutoPipelineForText2Image

    auto = {"text": AutoPipelineForText2Image, "image": AutoPipelineForImage2Image,
            "inpaint": AutoPipelineForInpainting}[mode]  # fmt: skip
    try:
        made = auto.from_pipe(pipe, controlnet=controlnet)
    except ValueError as exc:
        raise ValueError(f"control: diffusers has no {mode} ControlNet pipeline for {type(pipe).__name__}") from exc
    made.set_progress_bar_config(disable=True)
    return made


def control_modes(pipe: Any, modes: tuple[str, ...], controlnets: dict[str, Any]) -> tuple[str, ...]:
    """The pipeline modes of ``modes`` (text, image, inpaint) diffusers has the family's ControlNet pipeline
    for: each made once over the loaded components (``from_pipe``: no new weights); () without a ControlNet."""
    if not controlnets:
        return ()
    first = next(iter(controlnets.values()))
    found = []
    for mode in ("text", "image", "inpaint"):
        if mode not in modes:
            continue
        try:
            control_pipeline(pipe, mode, first)
        except (ValueError, TypeError):
            continue
        found.append(mode)
    return tuple(found)


def call_arguments(job: InferenceJob, pipe: Any) -> dict[str, Any]:
    """The ControlNet pipeline's arguments for ``job``: its maps (``control_image`` where the pipeline
    takes one: every image mode's, and FLUX.1's, SD3's, Qwen-Image's and Z-Image's text to image; else
    ``image``, SD's and SDXL's text to image), scale and window."""
    import inspect

    _, scale, start, end = settings_of(job)
    takes = inspect.signature(pipe.__call__).parameters
    return {"control_image" if "control_image" in takes else "image": list(job.controls),
            "controlnet_conditioning_scale": scale, "control_guidance_start": start,
            "control_guidance_end": end}  # fmt: skip

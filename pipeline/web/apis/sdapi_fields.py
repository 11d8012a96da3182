"""AUTOMATIC1111's request fields as this app's (``sdapi``): what maps, what is refused by name, and
A1111's ``info`` record of a finished request.

A field asking for what this app does not do is refused naming it (422), unless it is at its
default; the app's own validation (ranges, the cost budget, the model's sizes) runs after, in
``Adapter.run``, as for every request, and its errors are given the A1111 field's name
(``A1111_NAME``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from ... import fields
from ...errors import InvalidRequest
from ...fields import number, show
from ...loras import strip_tags
from ...protocol import ModelProfile
from ...request import DEFAULT_MASK_BLUR, HIRES_SCALES, Limits
from ...serving.postprocess import sampler_name
from ...uploads import MaskUpload
from . import a1111
from .peer_api import b64_bytes

VERSION = "t2i-app"
# Fields whose value, unless it is this default, asks for what this app does not do: refused by name.
_REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    "restore_faces": (False, None),
    "tiling": (False, None),
    "subseed_strength": (0, 0.0, None),
    "styles": ([], None),
    "script_name": (None, ""),
    "script_args": ([], None),
    "hr_checkpoint_name": (None, ""),
    "hr_prompt": ("", None),
    "hr_negative_prompt": ("", None),
    "hr_sampler_name": (None, ""),
    "resize_mode": (0, None),
}
_INPAINTING_FILL = {0: "fill", 1: "original"}  # both start from the picture (diffusers' inpainting)


def model_title(profile: ModelProfile) -> str:
    """A1111's checkpoint title: its name and short hash in brackets (``name [0123456789]``), where known."""
    return f"{profile.model_id} [{profile.hash}]" if profile.hash else profile.name


def checkpoint(value: Any, profile: ModelProfile, field: str = "sd_model_checkpoint") -> ModelProfile:
    """The served model an ``sd_model_checkpoint`` names (its title, name, full name or short hash; several
    models, issue 52); an ``InvalidRequest`` naming ``field`` and the titles for any other."""
    for p in profile.served:
        if isinstance(value, str) and value.strip() in {model_title(p), p.model_id, p.name, p.hash} - {""}:
            return p
    titles = ", ".join(repr(model_title(p)) for p in profile.served)
    raise InvalidRequest(field, f"{field} must be a served model ({titles}; /sdapi/v1/sd-models); got {show(value)}")


def samplers_of(profile: ModelProfile, limits: Limits) -> list[str]:
    """A1111's sampler names this model offers: its own scheduler's first, then the choices."""
    own = sampler_name(profile.sampler)
    return list(dict.fromkeys([own, *(s for s in limits.samplers if s != "default")]))


def sampler_choice(
    name: Any, schedule: Any, profile: ModelProfile, limits: Limits, field: str = "sampler_name"
) -> tuple[str, str]:
    """(the app's ``scheduler`` value, a note or "") for A1111's ``sampler_name`` (or ``field``, the
    name the client sent it under: ``sampler_index``) and ``scheduler``."""
    choices = [s for s in limits.samplers if s != "default"]
    if not isinstance(name, str) or not name:
        return "default", ""
    own = sampler_name(profile.sampler)
    if not choices:  # the model takes no sampler choice (flow matching, distilled): its own runs
        same = a1111.sampler_key(name) == a1111.sampler_key(own)
        return "default", "" if same else f"{field} {name!r} not applied: this model runs only its own ({own})"
    wanted = [name]
    if isinstance(schedule, str) and schedule.lower() not in ("", "automatic", "uniform", "normal"):
        wanted.insert(0, f"{name} {schedule}")  # A1111 1.9+: sampler "DPM++ 2M", scheduler "Karras"
    for candidate in wanted:
        if a1111.sampler_key(candidate) == a1111.sampler_key(own):
            return "default", ""
        if (choice := a1111.match_sampler(candidate, choices)) is not None:
            return choice, ""
    offered = ", ".join(samplers_of(profile, limits))
    raise InvalidRequest(field, f"{field} must be one of {offered}; got {show(name)}")


def a1111_raw(
    body: Mapping[str, Any], profile: ModelProfile, limits: Limits, *, img2img: bool, chosen: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """An A1111 request as the app's raw request (``request.FIELDS``), and notes on what was not applied.

    The model: ``override_settings.sd_model_checkpoint``, else ``chosen`` (the caller's own default, set
    through ``POST options``), else the server's (issue 52); the rest is read against that model's defaults.
    Raises ``InvalidRequest`` naming the A1111 field. The app's own validation (ranges, the cost
    budget, the model's sizes) runs after, in ``Adapter.run``, as for every request."""
    for name, defaults in _REFUSED_UNLESS.items():
        if name in body and body[name] not in defaults:
            raise InvalidRequest(name, f"{name} is not supported by this app; leave it at {defaults[0]!r}")
    check_overrides(body.get("override_settings"), profile)
    overrides = body.get("override_settings") or {}
    named = overrides.get("sd_model_checkpoint") if isinstance(overrides, dict) else None
    field = "override_settings.sd_model_checkpoint"
    picked = checkpoint(named, profile, field) if named not in (None, "") else profile.of(chosen or None)
    several = len(profile.served) > 1 or named not in (None, "")
    if several:
        profile, limits = picked, limits.pick(picked.model_id)
    notes: list[str] = []
    prompt = _text(body, "prompt", limits.max_prompt_chars)  # its length first: no pattern reads more
    text, tags = strip_tags(prompt)
    raw: dict[str, Any] = {
        "prompt": text,
        "negative_prompt": _text(body, "negative_prompt", limits.max_prompt_chars),
        "width": _number(body, "width", profile.default_width),  # A1111's own: 512, its SD 1.5's
        "height": _number(body, "height", profile.default_height),
        "num_inference_steps": _number(body, "steps", 20),
        "guidance_scale": _number(body, "cfg_scale", 7.0),
        "live_preview": True,  # A1111 shows live previews by default: ``progress`` returns them
        "mode": "text",
        **({"model": limits.model} if several else {}),
    }
    seed = _number(body, "seed", -1)
    raw["randomize_seed"] = seed == -1
    raw["seed"] = 0 if seed == -1 else seed
    batch, iterations = _number(body, "batch_size", 1), _number(body, "n_iter", 1)
    if not isinstance(batch, int) or not isinstance(iterations, int) or batch < 1 or iterations < 1:
        raise InvalidRequest("batch_size", "batch_size and n_iter must be whole numbers of at least 1")
    if batch * iterations > limits.max_images:
        raise InvalidRequest(
            "batch_size", f"batch_size × n_iter must be at most {limits.max_images}; got {batch} × {iterations}"
        )
    raw["num_images"] = batch * iterations
    field = "sampler_name" if body.get("sampler_name") else "sampler_index"
    sampler = body.get(field)
    raw["scheduler"], note = sampler_choice(sampler, body.get("scheduler"), profile, limits, field)
    notes += [note] if note else []
    if len(tags) > 1:
        raise InvalidRequest("prompt", "prompt: this app runs one LoRA per image; the prompt has several")
    if tags:
        name, scale = tags[0]
        known = {n.lower(): n for n in limits.loras}
        if name.lower() not in known:
            have = ", ".join(limits.loras) or "none"
            raise InvalidRequest("prompt", f"prompt: LoRA {name!r} is not loaded; this app has {have}")
        raw["lora"], raw["lora_scale"] = known[name.lower()], scale
    overrides = body.get("override_settings") or {}
    raw.update((name, overrides[name]) for name in fields.passed_through("a1111") if name in overrides)
    _controlnet(body.get("alwayson_scripts"), limits, raw, notes)
    if img2img:
        _img2img(body, raw, notes)
    elif body.get("enable_hr"):
        _hires(body, raw)
    return raw, notes


def _controlnet(scripts: Any, limits: Limits, raw: dict[str, Any], notes: list[str]) -> None:
    """AUTOMATIC1111's ControlNet extension's units (``alwayson_scripts.controlnet.args``) as the control
    fields: the one enabled unit's ``model``, ``module``, ``weight``, ``image``, ``guidance_start`` and
    ``guidance_end``; ``resize_mode`` and ``control_mode`` where they map; any other script refused by name."""
    if scripts in (None, {}):
        return
    if not isinstance(scripts, dict):
        raise InvalidRequest("alwayson_scripts", "alwayson_scripts must be an object of scripts")
    for name in scripts:
        if str(name).lower() != "controlnet":
            raise InvalidRequest("alwayson_scripts", f"alwayson_scripts: {str(name)[:40]!r} is not supported by "
                                 "this app; only ControlNet")  # fmt: skip
    script = next(iter(scripts.values()))
    args = script.get("args", []) if isinstance(script, dict) else None
    if not isinstance(args, list) or not all(isinstance(unit, dict) for unit in args):
        raise InvalidRequest("alwayson_scripts", "alwayson_scripts.controlnet.args must be a list of units")
    units = [u for u in args if u.get("enabled", True) and str(u.get("model", "None")).lower() not in ("none", "")]
    if not units:
        return
    if len(units) > 1:
        raise InvalidRequest("alwayson_scripts", f"alwayson_scripts.controlnet: this app runs one ControlNet unit a "
                             f"request; {len(units)} are enabled")  # fmt: skip
    unit, field = units[0], "alwayson_scripts.controlnet.args"
    model = str(unit.get("model")).split(" [", 1)[0]  # A1111 lists "NAME [hash]"
    if model not in limits.controls:
        raise InvalidRequest(field, f"{field}: model must be one of {', '.join(limits.controls) or 'none'} "
                             f"(/controlnet/model_list); got {show(unit.get('model'))}")  # fmt: skip
    module = MODULES.get(str(unit.get("module", "none")).lower())
    if module is None:
        raise InvalidRequest(field, f"{field}: module must be one of {', '.join(MODULE_LIST)} "
                             f"(/controlnet/module_list); got {show(unit.get('module'))}")  # fmt: skip
    if unit.get("control_mode", 0) not in (0, "Balanced"):
        raise InvalidRequest(field, f"{field}: control_mode must be 0 (Balanced) on this app; got "
                             f"{show(unit.get('control_mode'))}")  # fmt: skip
    if unit.get("mask") not in (None, ""):
        raise InvalidRequest(field, f"{field}: a unit's mask is not supported by this app; send none")
    image = unit.get("image") or unit.get("input_image")
    if isinstance(image, dict):  # the extension's newer {"image": ..., "mask": ...}
        image = image.get("image")
    if not isinstance(image, str) or not image:
        raise InvalidRequest(field, f"{field}: the unit needs its image (base64)")
    resize = unit.get("resize_mode", "Crop and Resize")
    if resize not in RESIZE_MODES:
        raise InvalidRequest(field, f"{field}: resize_mode must be one of {', '.join(RESIZE_MODES[:3])}; got "
                             f"{show(resize)}")  # fmt: skip
    if resize not in ("Just Resize", 0):
        notes.append(f"resize_mode {resize!r}: the map is resized to the image's size (Just Resize); a map of "
                     "the image's shape gives the same picture")  # fmt: skip
    raw.update(control=model, control_preprocess=module, control_image=b64_bytes(image, field),
               control_scale=unit.get("weight", 1.0), control_start=unit.get("guidance_start", 0.0),
               control_end=unit.get("guidance_end", 1.0))  # fmt: skip


# The extension's module names this app runs (its preprocessors, ``controls.PREPROCESSORS``).
MODULES = {"none": "none", "canny": "canny", "invert": "invert", "invert (from white bg & black line)": "invert"}
MODULE_LIST = ["none", "canny", "invert"]
RESIZE_MODES = ("Just Resize", "Crop and Resize", "Resize and Fill", 0, 1, 2)


def _img2img(body: Mapping[str, Any], raw: dict[str, Any], notes: list[str]) -> None:
    images = body.get("init_images")
    if not isinstance(images, list) or len(images) != 1:
        raise InvalidRequest("init_images", "init_images must be a list of exactly one base64 image")
    raw["image"] = b64_bytes(images[0], "init_images")
    raw["strength"] = _number(body, "denoising_strength", 0.75)
    mask = body.get("mask")
    if mask:
        fill = body.get("inpainting_fill", 0)
        if isinstance(fill, bool) or not isinstance(fill, int) or fill not in _INPAINTING_FILL:
            raise InvalidRequest(
                "inpainting_fill", f"inpainting_fill must be 0 (fill) or 1 (original) on this app; got {fill!r}"
            )
        invert = body.get("inpainting_mask_invert")
        if isinstance(invert, (dict, list)) or invert not in (None, 0, False, 1, True):
            raise InvalidRequest("inpainting_mask_invert", "inpainting_mask_invert must be 0 or 1")
        raw.update(mode="inpaint", mask=MaskUpload(b64_bytes(mask, "mask"), invert=bool(invert)),
                   mask_blur=_number(body, "mask_blur", DEFAULT_MASK_BLUR))  # fmt: skip
        if body.get("inpaint_full_res"):
            notes.append("inpaint_full_res not applied: the whole picture is redrawn at its size")
    else:
        raw["mode"] = "image"


def _hires(body: Mapping[str, Any], raw: dict[str, Any]) -> None:
    scale = _number(body, "hr_scale", 2.0)
    x, y = _number(body, "hr_resize_x", 0), _number(body, "hr_resize_y", 0)
    if x or y:  # a target size instead of a scale: the same scale on both sides
        width, height = raw["width"], raw["height"]
        for name, side in (("width", width), ("height", height)):
            if not side or side < 0:
                raise InvalidRequest(name, f"{name} must be a positive number of pixels with hr_resize_x; got {side}")
        scales = {x / width if x else None, y / height if y else None} - {None}
        if len(scales) != 1 or next(iter(scales)) not in HIRES_SCALES:
            raise InvalidRequest("hr_resize_x", f"hr_resize_x and hr_resize_y must be {width}x{height} times 1.5 or 2")
        scale = next(iter(scales))
    raw.update(
        hires_fix=True,
        hires_scale=scale,
        hires_strength=_number(body, "denoising_strength", 0.7),
        hires_steps=_number(body, "hr_second_pass_steps", 0),
    )


def check_overrides(overrides: Any, profile: ModelProfile) -> None:
    if overrides in (None, {}):
        return
    if not isinstance(overrides, dict):
        raise InvalidRequest("override_settings", "override_settings must be an object")
    for key, value in overrides.items():
        if key == "sd_model_checkpoint":  # any served model (several models: picks it for this request)
            checkpoint(value, profile, "override_settings.sd_model_checkpoint")
            continue
        if key in fields.passed_through("a1111"):  # the app's own per-request fields (``fields.TABLE``)
            continue
        raise InvalidRequest(
            "override_settings",
            f"override_settings: {key} cannot be changed per request on this app "
            f"(the model is fixed at start: {profile.name})",
        )


def current_options(profile: ModelProfile, limits: Limits, chosen: str = "") -> dict[str, Any]:
    """``GET /sdapi/v1/options``: A1111's options as this app runs them for the caller (the emphasis: the
    server's; the checkpoint: the caller's own default, ``chosen``, else the server's)."""
    profile = profile.of(chosen or None)
    emphasis = "None" if limits.prompt_syntax == "plain" else fields.family_emphasis(profile.family)
    return {
        "sd_model_checkpoint": model_title(profile),
        "sd_checkpoint_hash": profile.hash or None,
        "samples_format": "png",
        "live_previews_enable": True,
        "show_progress_every_n_steps": 1,
        "CLIP_stop_at_last_layers": 1,
        "emphasis": emphasis,
        "sd_vae": "Automatic",
        "send_seed": True,
    }


# A1111's "no change" values: the option as it is (``sd_vae`` "Automatic": the checkpoint's own VAE)
_NO_CHANGE = {"sd_vae": ("Automatic", "None", None)}


def check_options(body: Any, profile: ModelProfile, limits: Limits, chosen: str = "") -> str | None:
    """``POST /sdapi/v1/options``: the dict ``GET`` returned, any option at its current value or at
    A1111's "no change" value are taken (nothing changes); ``sd_model_checkpoint`` may name any served
    model: the caller's own default from now on (returned: its name; None: not named), never anyone
    else's. Any other real change is refused, naming the option and why (Open WebUI posts back the whole dict)."""
    if body in (None, {}):
        return None
    if not isinstance(body, dict):
        raise InvalidRequest("options", "the options must be an object")
    now = current_options(profile, limits, chosen)
    picked: str | None = None
    for key, value in body.items():
        if key == "sd_model_checkpoint":
            picked = checkpoint(value, profile).model_id
            continue
        if key == "sd_checkpoint_hash" or (key in now and value == now[key]) or value in _NO_CHANGE.get(key, ()):
            continue  # the hash follows the checkpoint
        if key in fields.passed_through("a1111"):
            why = f"it is a per-request setting here: send it in each request's override_settings ({key})"
        elif key in now:
            why = f"this app runs with {now[key]!r} and does not change it"
        else:
            why = "this app has no such option to change"
        raise InvalidRequest(key, f"{key}: {show(value)} not applied: {why}")
    return picked


def _text(body: Mapping[str, Any], name: str, max_chars: int) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > max_chars:
        got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise InvalidRequest(name, f"{name} must be text of at most {max_chars} characters; got {got}")
    return value


def _number(body: Mapping[str, Any], name: str, default: Any) -> Any:
    """A number as sent, int or float (its range is the app's validation's); a numeral in a string
    too, as A1111's pydantic models take it (``seed: "-1"``)."""
    value = body.get(name, default)
    if value is None:
        return default
    read = number(name, value, text=True)
    if isinstance(value, str):
        return int(read) if float(read).is_integer() else float(read)
    return value


# The app's field names in its errors, as the A1111 field a client sent.
A1111_NAME = fields.a1111_names()


def a1111_info(
    body: Mapping[str, Any], info: dict[str, Any], texts: list[str], profile: ModelProfile, notes: list[str]
) -> dict[str, Any]:
    """A1111's ``info`` object for a finished request (its JSON string is the answer's ``info``)."""
    seeds = list(info.get("seeds", [info.get("seed")]))
    n = len(seeds)
    strength = info.get("strength", info.get("hires_strength"))
    return {
        "prompt": info["prompt"],
        "all_prompts": [info["prompt"]] * n,
        "negative_prompt": info["negative_prompt"],
        "all_negative_prompts": [info["negative_prompt"]] * n,
        "seed": seeds[0],
        "all_seeds": seeds,
        "subseed": seeds[0],
        "all_subseeds": seeds,
        "subseed_strength": 0,
        "width": info["width"],
        "height": info["height"],
        "sampler_name": info["scheduler"],
        "cfg_scale": info["guidance_scale"],
        "steps": info["num_inference_steps"],
        "batch_size": body.get("batch_size", 1),
        "restore_faces": False,
        "face_restoration_model": None,
        "sd_model_name": profile.of(info.get("model")).model_id,
        "sd_model_hash": profile.of(info.get("model")).hash or None,
        "sd_vae_name": None,
        "sd_vae_hash": None,
        "seed_resize_from_w": -1,
        "seed_resize_from_h": -1,
        "denoising_strength": strength,
        "extra_generation_params": {"Notes": "; ".join(notes)} if notes else {},
        "index_of_first_image": 0,
        "infotexts": texts,
        "styles": [],
        "job_timestamp": time.strftime("%Y%m%d%H%M%S", time.gmtime(info["timings"]["received"])),
        "clip_skip": 1,
        "is_using_inpainting_conditioning": False,
        "version": VERSION,
        "request_id": info["request_id"],
    }

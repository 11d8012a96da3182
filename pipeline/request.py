"""Raw API values -> a validated, frozen ``GenerateRequest``.

Gradio components do not validate API input (sliders pass NaN, inf and off-step values, and
``Textbox(max_length)`` is not checked on the server), so every field is checked here, before any
GPU work. Each error names the field and the allowed range. Nothing is silently fixed but line breaks
(a carriage return is a newline); a prompt longer than an encoder's window is noted in ``warnings``.

The picture fields (``image_fields``): text mode takes none of them (a picture sent with it is
refused, so a client never believes it was used); the image modes take an uploaded image, read by
``uploads.read_image`` (bytes only, capped before decoding) and resized to the request's width x
height (AUTOMATIC1111's "just resize"):

- **image** (image-to-image): the picture, denoised from ``strength`` (0 < s <= 1);
- **inpaint**: also a mask, white (or, on a layer with alpha, painted) where the picture is redrawn;
- **outpaint**: the canvas grows by ``outpaint_left/top/right/bottom`` pixels; the new border is
  filled from the picture's edge and redrawn (``uploads.outpaint_canvas``);
- **hires fix** (``hires_fix``, text mode only): the picture is upscaled by ``hires_scale`` (1.5 or
  2, Lanczos) and redrawn at that size from ``hires_strength`` with ``hires_steps`` steps (0: the
  request's own), as one request in two passes.

A mode runs ``int(steps * strength)`` steps (diffusers' own count), so a strength that would run
none is refused by name; the cost budget counts the steps run, both passes of hires fix and the
uploads' pixels. Decoding an upload takes milliseconds (a second at the caps), so the adapters
validate every other field first (``pictures_later``), let the request's gates answer, and only then
decode its pictures (``with_pictures``) off the event loop, in a pool of their own
(``serving.decoding``).
"""

from __future__ import annotations

import dataclasses
import html
import math
import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
from PIL import Image

from . import fields
from .errors import InvalidRequest
from .fields import (
    DEFAULT_EMPHASIS,
    DEFAULT_MODEL,
    MODES,
    SIDES,
    T5_WEIGHING,
    WEIGHING,
    fits_every_window,
    flag,
    normalized,
    real_number,
    show,
    text_problem,
    truncation_notes,
    whole_number,
)
from .loras import SCALE_MAX, SCALE_MIN
from .prompt_syntax import BREAK, plain
from .protocol import NONE, InferenceJob, LoraUse, ModelProfile
from .uploads import MAX_UPLOAD_PIXELS, outpaint_canvas, read_image, read_mask

if TYPE_CHECKING:
    from .config import Settings

MAX_SEED = 2**32 - 1
MODE_WORDS = {"image": "image-to-image", "inpaint": "inpainting", "outpaint": "outpainting"}
PIPELINE_MODE = {"text": "text", "image": "image", "inpaint": "inpaint", "outpaint": "inpaint"}
HIRES_SCALES = (1.5, 2.0)
DEFAULT_STRENGTH = fields.BY_NAME["strength"].default  # AUTOMATIC1111's default denoising strength
DEFAULT_HIRES_STRENGTH = fields.BY_NAME["hires_strength"].default
DEFAULT_MASK_BLUR = fields.BY_NAME["mask_blur"].default
MAX_MASK_BLUR = 64
HIRES_UPSCALER = "Lanczos"
IMAGE_FIELDS = ("mode", "image", "mask", "strength", *SIDES, "mask_blur", "hires_fix", "hires_scale",
                "hires_strength", "hires_steps")  # fmt: skip
# The picture fields' defaults, as the API declares them (``fields.TABLE``): a text-to-image request's values.
PICTURE_DEFAULTS: dict[str, Any] = {name: fields.BY_NAME[name].default for name in IMAGE_FIELDS}
FIELDS = fields.NAMES  # the request's fields in the API's order (``fields.TABLE``)
DEFAULT_SAMPLER = "default"  # the model's own sampler
BUDGET_DEFAULT_JOBS = 8  # the default cost budget: at least this many of the model's default job (one image)


@dataclass(frozen=True)
class Limits:
    min_size: int
    max_size: int
    size_multiple: int
    max_pixels: int
    min_steps: int
    max_steps: int
    min_guidance: float
    max_guidance: float
    max_images: int
    max_prompt_chars: int
    text_encoders: tuple[tuple[str, int], ...]
    negative_prompt: bool = True  # False: the model does not use one (FLUX), so a non-empty one is refused
    samplers: tuple[str, ...] = (DEFAULT_SAMPLER,)  # the sampler names this model offers
    max_pixel_steps: int = 0  # width × height × steps × images one request may cost; 0: no budget
    negative_reason: str = ""  # why the model reads no negative prompt (where ``negative_prompt`` is False)
    step_choices: tuple[int, ...] = ()  # only these step counts run (Sana Sprint); empty: the whole range
    size_choices: tuple[tuple[int, int], ...] = ()  # only these sizes run (Kandinsky 5, HiDream); empty: any
    cfg_above: float = 1.0  # a negative prompt is read only above this guidance
    loras: tuple[str, ...] = ()  # the LoRAs' names (``--lora``); a request may pick one or "none"
    modes: tuple[str, ...] = ("text",)  # the pipeline modes the model serves (``engine.model.modes``)
    mode_notes: tuple[tuple[str, str], ...] = ()  # why each other mode is not served
    family: str = ""  # the model's family (``ModelProfile.family``): how its prompts are read (``prompt_syntax``)
    prompt_syntax: str = "a1111"  # ``--prompt-syntax``: a1111 or plain
    loop_modes: tuple[str, ...] = ("text",)  # the modes whose jobs run in step-level loops (``ModelProfile``)
    step_caches: tuple[str, ...] = ()  # the step-cache methods the model offers ("auto"'s first; issue 50)
    step_cache: str = "off"  # ``--step-cache``: what a request's "default" runs
    controls: tuple[str, ...] = ()  # the ControlNets' names (``--controlnet``); a request may pick one or "none"
    control_modes: tuple[str, ...] = ()  # the pipeline modes its family has ControlNet pipelines for
    model: str = ""  # the model these limits are (its ``model_id``; issue 52)
    models: tuple[Limits, ...] = ()  # on the default model's: every other served model's limits

    def pick(self, name: Any) -> Limits:
        """The limits of the model ``name`` picks (None, "" or "default": these, the default's); an
        ``InvalidRequest`` naming ``model`` and the served names for any other."""
        if name in (None, "", DEFAULT_MODEL, self.model):
            return self
        for other in self.models:
            if name == other.model:
                return other
        names = ", ".join(repr(n) for n in (DEFAULT_MODEL, self.model, *(m.model for m in self.models)))
        raise InvalidRequest("model", f'model must be one of {names} (/health\'s "models"); got {show(name)}')

    @property
    def served(self) -> tuple[str, ...]:
        """Every served model's name, the default first."""
        return (self.model, *(m.model for m in self.models))

    @classmethod
    def for_model(
        cls,
        profile: ModelProfile,
        *,
        max_images: int = 4,
        max_prompt_chars: int = 2000,
        max_size: int | None = None,
        max_steps: int | None = None,
        max_pixels: int | None = None,
        max_pixel_steps: int | None = None,
        prompt_syntax: str = "a1111",
        step_cache: str = "off",
    ) -> Limits:
        top = max_size or profile.max_size
        pixels = max_pixels or top * top
        steps = max_steps or profile.max_steps
        return cls(
            max_size=top,
            max_pixels=pixels,
            max_steps=steps,
            max_images=max_images,
            max_prompt_chars=max_prompt_chars,
            negative_prompt=profile.supports_negative_prompt,
            max_pixel_steps=max_pixel_steps or default_budget(profile, pixels, steps),
            negative_reason=profile.negative_prompt_reason,
            loras=tuple(info.name for info in profile.loras),
            prompt_syntax=prompt_syntax,
            step_cache=step_cache,
            model=profile.model_id,
            **{name: getattr(profile, name) for name in _AS_PROFILE},
        )


# the limits that are the profile's own, under its names
_AS_PROFILE = ("min_size", "size_multiple", "min_steps", "min_guidance", "max_guidance", "text_encoders", "samplers",
               "step_choices", "size_choices", "cfg_above", "modes", "mode_notes", "family", "loop_modes",
               "step_caches", "controls", "control_modes")  # fmt: skip


def default_budget(profile: ModelProfile, max_pixels: int, max_steps: int) -> int:
    """The cost budget with no ``--max-pixel-steps``: what the page offers by default always fits (issue 48:
    the embedded model's own largest size at its default steps was refused): the largest size at the
    default steps, the default size at the most steps, and at least ``BUDGET_DEFAULT_JOBS`` default jobs
    (four images at the default size and steps, and then some)."""
    default_pixels = profile.default_width * profile.default_height
    return max(
        BUDGET_DEFAULT_JOBS * default_pixels * profile.default_steps,
        max_pixels * profile.default_steps,
        default_pixels * max_steps,
    )


# -- the picture fields: the image modes and hires fix (see the module docstring) -------------------
@dataclass(frozen=True)
class Hires:
    """Hires fix: the second pass's scale, strength and steps (the width and height it redraws at)."""

    scale: float
    strength: float
    steps: int
    width: int
    height: int


@dataclass(frozen=True, eq=False)
class Pictures:
    """An image mode's pictures, ready for the job: at the job's size, the mask (L, white: redraw)."""

    mode: str  # image, inpaint or outpaint
    image: Image.Image = field(repr=False)
    mask: Image.Image | None = field(default=None, repr=False)
    upload_pixels: int = 0  # the decoded uploads' pixels (the cost budget counts them)
    outpaint: tuple[int, int, int, int] = (0, 0, 0, 0)  # left, top, right, bottom


@dataclass(frozen=True)
class ImageFields:
    """The picture fields of one request, checked (``mode`` "text": no pictures, maybe hires fix)."""

    mode: str = "text"
    strength: float = 1.0
    mask_blur: int = 0
    pictures: Pictures | None = field(default=None, compare=False)
    hires: Hires | None = None
    width: int = 0  # the job's size: the request's, or the outpainted canvas
    height: int = 0

    @property
    def pipeline_mode(self) -> str:
        return PIPELINE_MODE[self.mode]

    def steps_run(self, steps: int) -> int:
        """The denoising steps the first pass runs (diffusers: ``int(steps * strength)``, at most ``steps``)."""
        return steps if self.mode == "text" else min(int(steps * self.strength), steps)

    def parameters(self) -> dict[str, Any]:
        """The picture fields actually used, under the API's names (the pictures themselves are not kept)."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.mode != "text":
            out["strength"] = self.strength
        if self.mode in ("inpaint", "outpaint"):
            out["mask_blur"] = self.mask_blur
        if self.mode == "outpaint" and self.pictures is not None:
            out.update(zip(SIDES, self.pictures.outpaint))
        if self.hires is not None:
            out.update(hires_fix=True, hires_scale=self.hires.scale, hires_strength=self.hires.strength,
                       hires_steps=self.hires.steps)  # fmt: skip
        return out

    def hires_steps_run(self) -> int:
        return 0 if self.hires is None else min(int(self.hires.steps * self.hires.strength), self.hires.steps)


def has_pictures(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` carries an upload (its decode takes milliseconds: the caller runs ``validate`` off the loop)."""
    return any(raw.get(name) is not None for name in ("image", "mask", "control_image"))


def image_fields(
    raw: Mapping[str, Any],
    limits: Limits,
    *,
    width: int,
    height: int,
    steps: int,
    modes: tuple[str, ...],
    mode_notes: Mapping[str, str],
    pictures_later: bool = False,
    upload_pixels: int = MAX_UPLOAD_PIXELS,
) -> ImageFields:
    """Check the picture fields of ``raw`` (``modes``: the pipeline modes the model serves).
    ``pictures_later``: check every field but the pictures themselves (the join-time validator,
    and ``validate`` before the request's gates: they are decoded by ``with_pictures``).
    ``upload_pixels``: the pixels the uploads may have together (what the cost budget leaves),
    checked against each picture's header before its rows are decoded."""
    mode = raw.get("mode", "text")
    if mode is None or mode == "":
        mode = "text"
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidRequest("mode", f"mode must be one of: {', '.join(MODES)}; got {show(mode)}")
    needed = PIPELINE_MODE[mode]
    hires_on = flag("hires_fix", raw.get("hires_fix", False))
    if needed not in modes or (hires_on and "image" not in modes):
        missing = needed if needed not in modes else "image"
        why = mode_notes.get(missing, "the model has no such pipeline")
        field_name = "mode" if needed not in modes else "hires_fix"
        words = MODE_WORDS.get(mode, "hires fix") if field_name == "mode" else "hires fix (an image-to-image pass)"
        raise InvalidRequest(field_name, f"{field_name}: this model does not serve {words}: {why}")
    if mode == "text":
        for name in ("image", "mask", *SIDES):
            if raw.get(name) not in (None, 0, b""):
                raise InvalidRequest(name, f"{name}: only the image, inpaint and outpaint modes take it; mode is text")
        hires = _hires(raw, limits, width, height, steps) if hires_on else None
        return ImageFields(hires=hires, width=width, height=height)
    if hires_on:
        raise InvalidRequest(
            "hires_fix", f"hires_fix: only text mode takes it (it redraws a new picture); mode is {mode}"
        )
    strength = real_number("strength", raw.get("strength", DEFAULT_STRENGTH), 0.0, 1.0, above=True)
    if int(steps * strength) < 1:
        raise InvalidRequest(
            "strength",
            f"strength must be at least {1 / steps:.3g} with num_inference_steps {steps} (so that at least one "
            f"step runs: steps × strength ≥ 1); got {strength:g}",
        )
    blur = whole_number("mask_blur", raw.get("mask_blur", DEFAULT_MASK_BLUR), 0, MAX_MASK_BLUR)
    if raw.get("image") is None:
        raise InvalidRequest("image", f"image: {MODE_WORDS[mode]} needs an image (PNG, JPEG or WebP)")
    if mode == "inpaint" and raw.get("mask") is None:
        raise InvalidRequest("mask", "mask: inpainting needs a mask (white, or painted, where it redraws)")
    pads = _pads(raw, limits, width, height) if mode == "outpaint" else (0, 0, 0, 0)
    size = (width + pads[0] + pads[2], height + pads[1] + pads[3])
    if pictures_later:
        return ImageFields(mode, strength, blur if mode != "image" else 0, None, None, *size)
    budget = "" if upload_pixels >= MAX_UPLOAD_PIXELS else _BUDGET_NOTE
    image = read_image(raw["image"], "image", max_pixels=min(upload_pixels, MAX_UPLOAD_PIXELS), note=budget)
    uploaded = image.width * image.height
    picture = image.resize((width, height), Image.Resampling.LANCZOS) if image.size != (width, height) else image
    if mode == "image":
        return ImageFields(mode, strength, 0, Pictures(mode, picture, None, uploaded), None, width, height)
    if mode == "inpaint":
        left = min(upload_pixels - uploaded, MAX_UPLOAD_PIXELS)
        mask = read_mask(raw["mask"], (width, height), blur, max_pixels=max(0, left), note=budget)
        uploaded += mask.width * mask.height
        if not np.asarray(mask).any():
            raise InvalidRequest("mask", "mask: it marks nothing to redraw (paint or whiten where the picture changes)")
        return ImageFields(mode, strength, blur, Pictures(mode, picture, mask, uploaded), None, width, height)
    canvas, mask = outpaint_canvas(picture, pads, blur)
    return ImageFields(mode, strength, blur, Pictures(mode, canvas, mask, uploaded, pads), None, *size)


def _pads(raw: Mapping[str, Any], limits: Limits, width: int, height: int) -> tuple[int, int, int, int]:
    """Outpainting's left, top, right and bottom, checked (multiples of the size step; the canvas within the limits)."""
    pads = tuple(whole_number(name, raw.get(name, 0), 0, limits.max_size) for name in SIDES)
    m = limits.size_multiple
    for name, pad in zip(SIDES, pads):
        if pad % m:
            raise InvalidRequest(name, f"{name} must be a multiple of {m} between 0 and {limits.max_size}; got {pad}")
    left, top, right, bottom = pads
    if not any(pads):
        raise InvalidRequest("outpaint_left", "outpaint_left/top/right/bottom: outpainting needs at least one side")
    canvas_w, canvas_h = width + left + right, height + top + bottom
    if max(canvas_w, canvas_h) > limits.max_size or canvas_w * canvas_h > limits.max_pixels:
        raise InvalidRequest(
            "outpaint_right" if canvas_w > limits.max_size else "outpaint_bottom",
            f"the outpainted canvas must be at most {limits.max_size} a side and {limits.max_pixels} pixels; "
            f"got ({width}+{left}+{right})×({height}+{top}+{bottom}) = {canvas_w}×{canvas_h}",
        )
    return left, top, right, bottom


def _hires(raw: Mapping[str, Any], limits: Limits, width: int, height: int, steps: int) -> Hires:
    scale = real_number("hires_scale", raw.get("hires_scale", 2.0), 1.0, 4.0)
    if scale not in HIRES_SCALES:
        choices = " or ".join(f"{s:g}" for s in HIRES_SCALES)
        raise InvalidRequest("hires_scale", f"hires_scale must be {choices}; got {scale:g}")
    # 0: the picture upscaled and not redrawn (AUTOMATIC1111's denoising_strength 0, which its own API
    # tests send with hires fix); above 0, at least one redrawing step.
    strength = real_number("hires_strength", raw.get("hires_strength", DEFAULT_HIRES_STRENGTH), 0.0, 1.0)
    hires_steps = whole_number("hires_steps", raw.get("hires_steps", 0), 0, limits.max_steps)
    second = hires_steps or steps
    if strength > 0 and int(second * strength) < 1:
        raise InvalidRequest(
            "hires_strength",
            f"hires_strength must be 0 (upscale only) or at least {1 / second:.3g} with {second} hires steps "
            f"(so that at least one step runs); got {strength:g}",
        )
    m = limits.size_multiple
    big_w, big_h = (math.floor(side * scale / m) * m for side in (width, height))
    if max(big_w, big_h) > limits.max_size or big_w * big_h > limits.max_pixels:
        raise InvalidRequest(
            "hires_scale",
            f"hires_scale {scale:g} makes {big_w}×{big_h}; the largest is {limits.max_size} a side and "
            f"{limits.max_pixels} pixels: lower the scale, the width or the height",
        )
    return Hires(scale, strength, second, big_w, big_h)


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt: str
    negative_prompt: str
    seed: int
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    num_images: int
    warnings: tuple[str, ...] = ()
    live_preview: bool = False
    sampler: str = DEFAULT_SAMPLER  # the API's field ``scheduler``
    lora: str = ""  # a loaded adapter's name; "": none
    lora_scale: float = 1.0
    pictures: ImageFields = dataclasses.field(default_factory=ImageFields)  # the mode, its pictures, hires fix
    options: tuple[tuple[str, Any], ...] = ()  # the table fields (``fields.checked``), by name
    family: str = ""  # the model's family: how the job carries the prompts (``_read_text``)
    prompt_chunks: int = 1  # CLIP chunks of 75 tokens its longest text takes (``with_token_notes``)
    control_map: Image.Image | None = field(default=None, compare=False, repr=False)  # its ControlNet's (issue 51)

    @property
    def mode(self) -> str:
        return self.pictures.mode

    @property
    def job_size(self) -> tuple[int, int]:
        """The size the job draws at: the request's, or the outpainted canvas."""
        return (self.pictures.width or self.width, self.pictures.height or self.height)

    @property
    def lora_use(self) -> LoraUse:
        """The adapter and scale this request runs with (batching keys compare it)."""
        return LoraUse.of(self.lora, self.lora_scale)

    @property
    def seeds(self) -> tuple[int, ...]:
        """One seed per image: image i uses ``seed + i``, so it can be reproduced on its own."""
        return tuple((self.seed + i) % (MAX_SEED + 1) for i in range(self.num_images))

    @property
    def model(self) -> str:
        """The served model it runs on, by name ("": the default; issue 52)."""
        return str(dict(self.options).get("model", ""))

    @property
    def emphasis(self) -> str:
        """Its ``emphasis`` field: "default" or one of A1111's (``fields.EMPHASES``)."""
        return str(dict(self.options).get("emphasis", DEFAULT_EMPHASIS))

    def to_job(self) -> InferenceJob:
        p, n = self.pictures, self.num_images
        hires = p.hires
        emphasis, family = self.emphasis, self.family
        return InferenceJob(
            request_id=self.request_id,
            prompts=(_read_text(self.prompt, emphasis, family),) * n,
            negative_prompts=(_read_text(self.negative_prompt, emphasis, family),) * n,
            seeds=self.seeds,
            width=self.job_size[0],
            height=self.job_size[1],
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            preview_every=max(1, self.num_inference_steps // 8) if self.live_preview else 0,
            sampler=self.sampler,
            lora=self.lora_use.name,
            lora_scale=self.lora_use.scale,
            mode=p.pipeline_mode,
            images=(p.pictures.image,) * n if p.pictures is not None else (),
            masks=(p.pictures.mask,) * n if p.pictures is not None and p.pictures.mask is not None else (),
            strength=p.strength,
            hires_width=hires.width if hires else 0,
            hires_height=hires.height if hires else 0,
            hires_steps=hires.steps if hires else 0,
            hires_strength=hires.strength if hires else 0.0,
            options=self.options,
            controls=(self.control_map,) * n if self.control_map is not None else (),
        )

    def parameters(self) -> dict[str, Any]:
        """The parameters actually used, under the API's own names."""
        return {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "seed": self.seed,
            "seeds": list(self.seeds),
            "width": self.width,
            "height": self.height,
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
            "num_images": self.num_images,
            "scheduler": self.sampler,
            "lora": self.lora or NONE,
            "lora_scale": self.lora_scale,
            **self.pictures.parameters(),
            **dict(self.options),
        }


def _read_text(text: str, emphasis: str, family: str) -> str:
    """What a job carries for ``text``: as written where the family weighs CLIP or T5 tokens (the model
    side parses it, ``engine.model.prompt_weights``) or the syntax is off (emphasis "None"); else the text
    with the syntax removed (``prompt_syntax.plain``: T5 and LLM encoders take no weights)."""
    return text if family in WEIGHING or family in T5_WEIGHING or emphasis == "None" else plain(text)


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


def _text(field: str, value: Any, max_chars: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(field, f"{field} must be text of at most {max_chars} characters; got {show(value)}")
    if len(value) > max_chars:
        raise InvalidRequest(
            field, f"{field} must be text of at most {max_chars} characters; got {len(value)} characters"
        )
    problem = text_problem(value)
    if problem is not None:
        raise InvalidRequest(field, f"{field} {problem}")
    return normalized(value)


def side_length(field: str, value: Any, limits: Limits) -> int:
    m, lo, hi = limits.size_multiple, limits.min_size, limits.max_size
    number = whole_number(field, value, lo, hi, f"a multiple of {m} between {lo} and {hi}")
    if number % m:
        raise InvalidRequest(field, f"{field} must be a multiple of {m} between {lo} and {hi}; got {show(value)}")
    return number


def _sampler(value: Any, limits: Limits) -> str:
    """One of the model's sampler names; None or "" means the model's own."""
    if value is None or value == "":
        return DEFAULT_SAMPLER
    if not isinstance(value, str) or value not in limits.samplers:
        choices = html.escape(", ".join(limits.samplers))
        raise InvalidRequest("scheduler", f"scheduler must be one of: {choices}; got {show(value)}")
    return value


def _lora(value: Any, limits: Limits) -> str:
    """A loaded adapter's name (any case), or "" for none (None, "" or "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", NONE)):
        return ""
    by_lower = {name.lower(): name for name in limits.loras}
    if isinstance(value, str) and value.strip().lower() in by_lower:
        return by_lower[value.strip().lower()]
    choices = html.escape(", ".join((NONE, *limits.loras)))
    loaded = "" if limits.loras else " (this server loaded no LoRAs: start it with --lora NAME=PATH)"
    raise InvalidRequest("lora", f"lora must be one of: {choices}{loaded}; got {show(value)}")


def _cost(width: int, height: int, steps: int, images: int, extra: ImageFields) -> tuple[int, str]:
    """A request's cost in pixel-steps, and its sum in words: width × height × steps × images; an
    image mode counts the steps it runs (``steps × strength``) and the uploads' pixels; hires fix its
    second pass too."""
    p = extra
    run = p.steps_run(steps)
    cost = p.width * p.height * run * images if p.width else width * height * run * images
    sums = f"{p.width or width}×{p.height or height}×{run}×{images}"
    if p.hires is not None:
        cost += p.hires.width * p.hires.height * p.hires_steps_run() * images
        sums += f" + {p.hires.width}×{p.hires.height}×{p.hires_steps_run()}×{images} (hires fix)"
    if p.pictures is not None:
        cost += p.pictures.upload_pixels
        sums += f" + {p.pictures.upload_pixels} (the uploads' pixels)"
    return cost, sums


def _within_budget(width: int, height: int, steps: int, images: int, limits: Limits, extra: ImageFields) -> None:
    """The cost budget (``--max-pixel-steps``; 0: no budget): ``_cost`` at most ``limits.max_pixel_steps``."""
    cost, sums = _cost(width, height, steps, images, extra)
    if limits.max_pixel_steps and cost > limits.max_pixel_steps:
        raise InvalidRequest(
            "num_inference_steps",
            f"width × height × num_inference_steps × num_images must be at most {limits.max_pixel_steps} "
            f"pixel-steps (the cost budget, --max-pixel-steps); got {sums} = {cost}",
        )


_BUDGET_NOTE = " (what the cost budget, --max-pixel-steps, leaves for this request's uploads)"


def with_pictures(request: GenerateRequest, raw: Mapping[str, Any], limits: Limits) -> GenerateRequest:
    """``request`` (validated with ``pictures_later``) with its pictures decoded from ``raw``: each
    picture's header is held to what the cost budget leaves before its rows are decoded. Milliseconds
    to a second of CPU at the caps (``uploads``): run off the event loop, after the request's gates."""
    w, h, steps, images = request.width, request.height, request.num_inference_steps, request.num_images
    spent, _ = _cost(w, h, steps, images, request.pictures)  # the job, without the uploads
    left = limits.max_pixel_steps - spent if limits.max_pixel_steps else MAX_UPLOAD_PIXELS
    if request.pictures.mode != "text":
        pictures = image_fields(raw, limits, width=w, height=h, steps=steps, modes=limits.modes,
                                mode_notes=dict(limits.mode_notes), upload_pixels=left)  # fmt: skip
        _within_budget(w, h, steps, images, limits, pictures)
        request = dataclasses.replace(request, pictures=pictures)
        left -= pictures.pictures.upload_pixels if pictures.pictures is not None else 0
    if raw.get("control_image") is None:
        return request
    from .controls import decoded_map  # only a request with a ControlNet map reads it (issue 51)

    return dataclasses.replace(request, control_map=decoded_map(raw, request.options, request.job_size, left))


def _steps(raw: Mapping[str, Any], limits: Limits) -> int:
    steps = whole_number("num_inference_steps", raw.get("num_inference_steps"), limits.min_steps, limits.max_steps)
    if limits.step_choices and steps not in limits.step_choices:
        choices = ", ".join(map(str, limits.step_choices))
        raise InvalidRequest(
            "num_inference_steps", f"num_inference_steps must be one of {choices} for this model; got {steps}"
        )
    return steps


def gradio_checks(raw: Mapping[str, Any]) -> None:
    """What the Gradio events (the page, ``gradio_client``, MCP) refuse beyond ``validate``: an empty
    prompt (a person pressed Generate on an empty box; an agent forgot the prompt)."""
    prompt = raw.get("prompt")
    if isinstance(prompt, str) and not prompt.strip():
        raise InvalidRequest("prompt", "prompt must not be empty")


def validate(
    raw: Mapping[str, Any],
    limits: Limits,
    count_tokens: Callable[[str], Mapping[str, int]] | None = None,
    *,
    request_id: str | None = None,
    pictures_later: bool = False,
) -> GenerateRequest:
    """Check every field of ``raw`` (the API's parameter names); raise ``InvalidRequest`` on the first bad one.
    ``pictures_later``: all but the pictures' bytes (``image_fields``), in microseconds: the join-time
    validator, and the adapters before the request's gates (then ``with_pictures`` decodes them).

    ``count_tokens`` measures prompts in text-encoder tokens; a prompt over the encoder's window is
    accepted and the note that it was truncated goes into ``warnings``.
    """
    unknown = set(raw) - set(FIELDS)
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(name, f"unknown field {show(name)}; the fields are {', '.join(FIELDS)}")
    limits = limits.pick(raw.get("model"))  # every other field is checked against its model's limits (issue 52)
    # An empty prompt draws unconditionally (diffusers and AUTOMATIC1111 take one: A1111's default is "");
    # the Gradio events, where a person pressed Generate on an empty box, refuse it (``gradio_checks``).
    prompt = _text("prompt", raw.get("prompt"), limits.max_prompt_chars)
    negative_prompt = _text("negative_prompt", raw.get("negative_prompt"), limits.max_prompt_chars)
    if negative_prompt and not limits.negative_prompt:
        why = limits.negative_reason or "this model does not use one"
        raise InvalidRequest(
            "negative_prompt",
            f"negative_prompt must be empty: {why}; describe what you want in the prompt instead",
        )
    randomize = raw.get("randomize_seed", False)
    if not isinstance(randomize, bool):
        raise InvalidRequest("randomize_seed", f"randomize_seed must be true or false; got {show(randomize)}")
    seed_value = raw.get("seed", 0)
    if randomize:
        seed = secrets.randbelow(MAX_SEED + 1)
        if seed_value is not None:  # still reject nonsense, so a client bug does not hide
            whole_number("seed", seed_value, 0, MAX_SEED)
    else:
        seed = whole_number("seed", seed_value, 0, MAX_SEED)
    width = side_length("width", raw.get("width"), limits)
    height = side_length("height", raw.get("height"), limits)
    if width * height > limits.max_pixels:
        raise InvalidRequest(
            "width",
            f"width × height must be at most {limits.max_pixels} pixels; got {width}×{height} = {width * height}",
        )
    if limits.size_choices and (width, height) not in limits.size_choices:
        choices = ", ".join(f"{w}×{h}" for w, h in limits.size_choices)
        raise InvalidRequest(
            "width",
            f"width × height must be one of {choices} for this model (it redraws any other size); got {width}×{height}",
        )
    steps = _steps(raw, limits)
    guidance = real_number("guidance_scale", raw.get("guidance_scale"), limits.min_guidance, limits.max_guidance)
    if negative_prompt and guidance <= limits.cfg_above:
        raise InvalidRequest(
            "negative_prompt",
            f"negative_prompt must be empty at guidance_scale {limits.cfg_above:g} or less: classifier-free "
            "guidance is off there, "
            f"so the negative prompt is never read; raise guidance_scale above {limits.cfg_above:g} "
            f"(up to {limits.max_guidance:g}) "
            "or leave negative_prompt empty",
        )
    num_images = whole_number("num_images", raw.get("num_images", 1), 1, limits.max_images)
    live_preview = raw.get("live_preview", False)
    if not isinstance(live_preview, bool):
        raise InvalidRequest("live_preview", f"live_preview must be true or false; got {show(live_preview)}")
    sampler = _sampler(raw.get("scheduler"), limits)
    lora = _lora(raw.get("lora"), limits)
    scale_value = raw.get("lora_scale")
    lora_scale = 1.0 if scale_value is None else real_number("lora_scale", scale_value, SCALE_MIN, SCALE_MAX)
    pictures = image_fields(
        raw, limits, width=width, height=height, steps=steps, modes=limits.modes,
        mode_notes=dict(limits.mode_notes), pictures_later=True,
    )  # fmt: skip
    _within_budget(width, height, steps, num_images, limits, pictures)
    options = fields.looped_step_cache(fields.checked(raw, limits), raw, pictures, limits.loop_modes)
    options = fields.control_rule(options, raw, pictures, limits)

    request = GenerateRequest(
        request_id=request_id or new_request_id(),
        prompt=prompt,
        negative_prompt=negative_prompt,
        seed=seed,
        width=width,
        height=height,
        num_inference_steps=steps,
        guidance_scale=guidance,
        num_images=num_images,
        live_preview=live_preview,
        sampler=sampler,
        lora=lora,
        lora_scale=lora_scale,
        pictures=pictures,
        options=options,
        family=limits.family,
    )
    if not pictures_later:
        request = with_pictures(request, raw, limits)
    return with_token_notes(request, limits, count_tokens) if count_tokens is not None else request


def _texts_to_count(request: GenerateRequest, limits: Limits) -> list[tuple[str, str]]:
    """(field, text) for each text of ``request`` that might not fit a text encoder's window, or that
    a ``BREAK`` may make more than one CLIP chunk (where the family weighs CLIP tokens)."""
    texts = (("prompt", request.prompt), ("negative_prompt", request.negative_prompt))
    chunked = limits.family in WEIGHING
    return [
        (field, text)
        for field, text in texts
        if text and (not fits_every_window(text, limits.text_encoders) or (chunked and BREAK in text))
    ]


def needs_token_count(request: GenerateRequest, limits: Limits) -> bool:
    """Whether a text of ``request`` might not fit a text encoder's window (``fits_every_window``)."""
    return bool(_texts_to_count(request, limits))


def with_token_notes(
    request: GenerateRequest, limits: Limits, count_tokens: Callable[[str], Mapping[str, int]]
) -> GenerateRequest:
    """``request`` with a note for each text an encoder will cut; counts only texts that might not fit.

    Where the family weighs CLIP tokens, CLIP reads a prompt whole, in chunks of 75 tokens: no note
    for it, the request's chunk count kept (``prompt_chunks``: calls batch only equal counts), and a
    text past ``MAX_PROMPT_CHUNKS`` refused by name."""
    chunked = limits.family in WEIGHING  # the model side encodes CLIP prompts in chunks (``prompt_weights``)
    encoders = tuple((e, w) for e, w in limits.text_encoders if not (chunked and e == "CLIP"))
    warnings, chunks = [], 1
    for name, text in _texts_to_count(request, limits):
        counts = count_tokens(_read_text(text, request.emphasis, limits.family))  # what the encoders read
        if chunked:
            key = "CLIP chunks as written" if request.emphasis == "None" else "CLIP chunks"
            n = int(counts.get(key, 1))
            if n > MAX_PROMPT_CHUNKS:
                raise InvalidRequest(
                    name,
                    f"{name} must be at most {MAX_PROMPT_CHUNKS} chunks of {CHUNK_TOKENS} CLIP tokens "
                    f"({MAX_PROMPT_CHUNKS * CHUNK_TOKENS} tokens; each BREAK starts a chunk); got {n} chunks",
                )
            chunks = max(chunks, n)
        warnings += truncation_notes(name, counts, encoders)
    if not warnings and chunks == 1:
        return request
    return dataclasses.replace(request, warnings=(*request.warnings, *warnings), prompt_chunks=chunks)


MAX_PROMPT_CHUNKS = 4  # CLIP chunks a prompt may take (``engine.model.prompt_weights``)
CHUNK_TOKENS = 75


def limits_for(settings: Settings, profile: ModelProfile) -> Limits:
    """The limits the app applies: the model's, narrowed by the settings (front end and replicas alike)."""

    def one(p: ModelProfile) -> Limits:
        fields.server_step_cache(settings.step_cache, p.step_caches, p.name)
        return Limits.for_model(
            p,
            max_images=settings.max_images,
            max_prompt_chars=settings.max_prompt_chars,
            max_size=settings.max_size,
            max_steps=settings.max_steps,
            max_pixels=settings.max_pixels,
            max_pixel_steps=settings.max_pixel_steps,
            prompt_syntax=settings.prompt_syntax,
            step_cache=settings.step_cache,
        )

    # several models (issue 52): each its own, on the default's
    return dataclasses.replace(one(profile), models=tuple(one(p) for p in profile.models))

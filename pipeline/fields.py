"""The request fields, once: the table every other place reads (issue 47).

A row (``Field``) is one field of a generate request, in the API's order: its name, the type the
API declares, its default (``REQUIRED``: the caller always sends it), the line the API page and MCP
show, the modes that read it, how AUTOMATIC1111 and OpenAI name it, and its key in the PNG
``parameters`` text. Derived from the table:

- the generate handler's signature (its annotations read from it) and docstring (``signature``,
  ``docstring``: Gradio reads them for the API page, ``gradio_client`` and MCP) and the raw request
  it builds (``raw_from``);
- ``request.FIELDS``, the unknown-field check and the picture fields' defaults (``defaults``);
- AUTOMATIC1111's name for each field in the app's errors (``a1111_names``), and the fields the two
  HTTP wire formats pass through under the app's own names (``passed_through``: OpenAI's
  ``extra_body``, A1111's ``override_settings``);
- a *table field* (``check`` set: a value checked on its own, with no rule that reads another
  field) is validated here (``checked``), carried on ``GenerateRequest.options`` and
  ``InferenceJob.options`` to the model side, reported in the info record, written to the PNG text
  when not at its default (``png_settings``) and read back from a pasted text (``pasted``).

Fields whose rules read other fields (the size and the cost budget, the seed, the image modes) keep
their checks in ``request.validate``; the table still declares them. A new table field is a row
here, the model side that reads it, and its tests.

One set of number parsers (``number``, ``whole_number``, ``real_number``, ``flag``, ``choice``): the
validation and both wire formats read numbers through them, and every error names the field. And the
prompt fields' text encoder windows: whether a prompt surely fits them (``fits_every_window``) and the
note for one that does not (``truncation_notes``).
"""

from __future__ import annotations

import contextlib
import html
import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import InvalidRequest

REQUIRED: Any = inspect.Parameter.empty  # no default: every caller sends it
MODES = ("text", "image", "inpaint", "outpaint")
IMAGE_MODES = ("image", "inpaint", "outpaint")
SIDES = ("outpaint_left", "outpaint_top", "outpaint_right", "outpaint_bottom")
# Step caching (issue 50, ``engine.loop.step_cache``): "off", "auto" (the model's recommended method),
# "default" (the server's ``--step-cache``), or one of the methods a model with step-level loops offers.
STEP_CACHE_OFF, STEP_CACHE_AUTO, STEP_CACHE_DEFAULT = "off", "auto", "default"
NONE = "none"  # ``protocol.NONE``: no LoRA, no ControlNet
DEFAULT_MODEL = "default"  # a request's ``model`` for its default model (issue 52: several models)
Options = tuple[tuple[str, Any], ...]  # the table fields of a request, by name (``checked``)
CONTROL_MODES = ("text", "image", "inpaint")  # the modes a ControlNet acts in (not outpainting: its canvas)
CONTROL_PREPROCESSORS = ("none", "canny", "invert")  # ``controls.PREPROCESSORS``
STEP_CACHE_METHODS = ("taylorseer", "reuse", "fbcache")  # every method the app knows, "auto"'s first
# AUTOMATIC1111's prompt syntax (``prompt_syntax``): its ``emphasis`` option's names, in its order, and
# "default": the server's (``--prompt-syntax``) and the family's. The families whose CLIP tokens are
# weighted (``engine.model.prompt_weights``) with their default emphasis, and those whose T5 tokens are;
# every other family reads the text with the syntax removed (``prompt_syntax.plain``).
EMPHASES = ("Original", "No norm", "None")
DEFAULT_EMPHASIS = "default"
WEIGHING = {"sd": "Original", "sdxl": "No norm", "sd3": "No norm"}
T5_WEIGHING = frozenset({"flux", "sd3"})  # T5 tokens weighted by ComfyUI's rule (``prompt_weights.t5_weighted``)
# Families whose step-level loops take one CLIP chunk count each: SD3's joint attention has no text
# mask, so a shorter prompt cannot be padded beside a longer one (SD 1.x/2.x's loops mask instead).
CHUNK_KEYED = frozenset({"sd3"})


# -- the number parsers ----------------------------------------------------------------------------
def show(value: Any) -> str:
    """A short, HTML-escaped rendering of a bad value."""
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return html.escape(text)


def number(
    field: str,
    value: Any,
    *,
    whole: bool = False,
    lo: float | None = None,
    hi: float | None = None,
    above: bool = False,
    text: bool = False,
    what: str | None = None,
) -> Any:
    """``value`` as a finite number (``whole``: an int; 7.0, as JSON sliders send, is 7, 7.5 is refused)
    within ``lo``..``hi`` (``above``: strictly above ``lo``); ``text``: a numeral in a string is read
    too (form fields, pasted text). Raises ``InvalidRequest`` naming ``field`` and the range."""
    sent = value
    if text and isinstance(value, str) and len(value) <= 40:
        with contextlib.suppress(ValueError):
            value = float(value)
    fine = not isinstance(value, bool) and isinstance(value, (int, float))
    if fine and isinstance(value, float):
        fine = math.isfinite(value) and (value.is_integer() or not whole)
    out = (int(value) if whole else float(value)) if fine else 0
    if not fine or (lo is not None and (out <= lo if above else out < lo)) or (hi is not None and out > hi):
        raise InvalidRequest(field, f"{field} must be {what or _range(whole, lo, hi, above)}; got {show(sent)}")
    return out


def _range(whole: bool, lo: float | None, hi: float | None, above: bool) -> str:
    kind = "a whole number" if whole else "a number"
    if lo is None or hi is None:
        return kind
    low, high = (str(b) if isinstance(b, int) else f"{b:g}" for b in (lo, hi))
    return f"{kind} above {low} and at most {high}" if above else f"{kind} between {low} and {high}"


def whole_number(field: str, value: Any, lo: int, hi: int, what: str | None = None) -> int:
    """An int in [lo, hi]. Integral floats (7.0, as JSON sliders send) are accepted; 7.5 is not."""
    return int(number(field, value, whole=True, lo=lo, hi=hi, what=what))


def real_number(field: str, value: Any, lo: float, hi: float, *, above: bool = False) -> float:
    """A finite float in [lo, hi] (``above``: in (lo, hi])."""
    return float(number(field, value, lo=lo, hi=hi, above=above))


def flag(field: str, value: Any, default: bool = False) -> bool:
    """True or false (None: ``default``)."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(field, f"{field} must be true or false; got {show(value)}")
    return value


def choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of ``choices``, exactly."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidRequest(field, f"{field} must be one of {', '.join(map(repr, choices))}; got {show(value)}")
    return value


# -- the table -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    name: str
    type: Any  # the type the API declares (Gradio's API page, MCP)
    default: Any  # REQUIRED: every caller sends it
    doc: str  # the API page's and MCP's line
    modes: tuple[str, ...] = MODES  # the modes that read it
    a1111: str = ""  # AUTOMATIC1111's name ("override_settings.X": one of its per-request settings); "": none
    openai: str = ""  # OpenAI's name ("extra_body": the app's own name, sent as an extra body field); "": none
    png: str = ""  # its key in the PNG parameters text; "": not written there
    check: Callable[[Any, Any], Any] | None = None  # a table field's check: (value, limits) -> the value
    unwritten: tuple[Any, ...] = ()  # checked values the PNG text leaves out, like the default


def _step_cache(value: Any, limits: Any) -> str:
    """The method a request runs with: "default" is the server's (``--step-cache``), "auto" the model's
    recommended one ("off" where it offers none); a method the model does not offer is refused by name."""
    offered = tuple(getattr(limits, "step_caches", ()))
    value = choice("step_cache", value, (STEP_CACHE_OFF, STEP_CACHE_AUTO, *offered, STEP_CACHE_DEFAULT))
    if value == STEP_CACHE_DEFAULT:
        value = getattr(limits, "step_cache", STEP_CACHE_OFF)
    if value == STEP_CACHE_AUTO:
        value = offered[0] if offered else STEP_CACHE_OFF
    return str(value)


def looped_step_cache(
    options: tuple[tuple[str, Any], ...], raw: Mapping[str, Any], pictures: Any, loop_modes: tuple[str, ...]
) -> tuple[tuple[str, Any], ...]:
    """Step caching runs in step-level loops (issue 50): a method named for a request that runs as one
    pipeline call (inpainting, outpainting: a mode not in ``loop_modes``; hires fix where the model's loop
    does not run its image-to-image pass) is refused by name; "auto" or the server's default is "off"
    there. (A rule that reads other fields: ``request.validate``'s.)"""
    method = dict(options).get("step_cache", STEP_CACHE_OFF)
    looped = pictures.pipeline_mode in loop_modes and (pictures.hires is None or "image" in loop_modes)
    if method == STEP_CACHE_OFF or looped:
        return options
    if raw.get("step_cache") == method:
        where = "hires fix" if pictures.hires is not None else f"mode {pictures.pipeline_mode!r}"
        hires = "with hires fix" if "image" in loop_modes else "without hires fix"
        raise InvalidRequest(
            "step_cache",
            f"step_cache {method!r} runs in step-level loops ({', '.join(loop_modes)} {hires} on "
            f"this model); {where} runs as one pipeline call: set step_cache to 'off' or 'auto'",
        )
    return tuple((k, STEP_CACHE_OFF if k == "step_cache" else v) for k, v in options)


def control_rule(options: tuple[tuple[str, Any], ...], raw: Mapping[str, Any], pictures: Any,
                 limits: Any) -> tuple[tuple[str, Any], ...]:  # fmt: skip
    """The control fields together: a map where a control is picked and none where it is not, a mode
    it acts in (``CONTROL_MODES``, where the model's family has the ControlNet pipeline:
    ``limits.control_modes``; a hires fix's second pass is image to image), and a window that does not
    end before it starts; where the model's loops run no ControlNet (``loop_modes`` without "control"),
    a request with one is one pipeline call, so a step cache named for it is refused by name ("auto" or
    the server's default: off there). (``request.validate``'s cross-field rule.)"""
    values = dict(options)
    name = values.get("control", NONE)
    mode, served = pictures.mode, getattr(limits, "control_modes", CONTROL_MODES)
    if name != NONE and mode not in CONTROL_MODES:
        raise InvalidRequest("control", f"control: a ControlNet acts in {', '.join(CONTROL_MODES)} modes; mode "
                             f"{mode!r} draws on a larger canvas than its map: set control to 'none'")  # fmt: skip
    hires = "image" if pictures.hires else None  # a hires fix's second pass
    for needed, what in ((pictures.pipeline_mode, f"mode {mode!r}"), (hires, "hires fix")):
        if name != NONE and needed is not None and needed not in served:
            raise InvalidRequest("control", f"control: diffusers has no ControlNet pipeline for {what} on this model "
                                 f"(a ControlNet acts in {', '.join(served) or 'no mode'} here): set control to "
                                 "'none'")  # fmt: skip
    sent = raw.get("control_image") not in (None, b"", "")
    if name == NONE and sent:
        raise InvalidRequest("control_image", "control_image: no ControlNet is picked (control is 'none'); "
                             "pick one in control, or send no control_image")  # fmt: skip
    if name != NONE and not sent:
        raise InvalidRequest("control_image", f"control_image: control {name!r} needs a map (PNG, JPEG or WebP; "
                             "white where things go, on black)")  # fmt: skip
    start, end = values.get("control_start", 0.0), values.get("control_end", 1.0)
    if end < start:
        raise InvalidRequest("control_end", f"control_end must be at least control_start ({start:g}), from 0 to 1; "
                             f"got {end:g}")  # fmt: skip
    method = values.get("step_cache", STEP_CACHE_OFF)
    if name == NONE or "control" in getattr(limits, "loop_modes", ()) or method == STEP_CACHE_OFF:
        return options
    if raw.get("step_cache") == method:
        raise InvalidRequest("step_cache", f"step_cache {method!r} runs in step-level loops, and this model's loops "
                             "run no ControlNet: a request with a control is one pipeline call; set step_cache to "
                             "'off' or 'auto'")  # fmt: skip
    return tuple((k, STEP_CACHE_OFF if k == "step_cache" else v) for k, v in options)


def server_step_cache(method: str, offered: tuple[str, ...], model: str) -> str:
    """``--step-cache``, where the model runs it: a method it does not offer stops the start, by name."""
    if method not in (STEP_CACHE_OFF, STEP_CACHE_AUTO, *offered):
        methods = ", ".join(offered) or "none: its family runs no step-level loop"
        raise SystemExit(f"--step-cache {method}: {model} does not run it (it offers {methods})")
    return method


def _model(value: Any, limits: Any) -> str:
    """The model's name (``Limits.pick``: "default" is the default's; any other served name as itself)."""
    if not isinstance(value, str):
        raise InvalidRequest("model", f"model must be a model's name (/health's \"models\"); got {show(value)}")
    return str(limits.pick(value.strip()).model)


def _control(value: Any, limits: Any) -> str:
    return choice("control", NONE if value in (None, "") else value, (NONE, *getattr(limits, "controls", ())))


def _fraction(name: str, hi: float = 1.0) -> Callable[[Any, Any], float]:
    return lambda value, limits: real_number(name, value, 0.0, hi)


def _preprocess(value: Any, limits: Any) -> str:
    return choice("control_preprocess", value, CONTROL_PREPROCESSORS)


def family_emphasis(family: str) -> str:
    """The emphasis ``DEFAULT_EMPHASIS`` means for ``family`` (A1111's "Original" for SD 1.x/2.x)."""
    return WEIGHING.get(family, "No norm")


def resolved_emphasis(emphasis: str, family: str) -> str:
    """A request's ``emphasis`` (``DEFAULT_EMPHASIS`` or one of ``EMPHASES``) as ``family`` applies it."""
    return family_emphasis(family) if emphasis == DEFAULT_EMPHASIS else emphasis


def _emphasis(value: Any, limits: Any) -> str:
    """AUTOMATIC1111's emphasis, or "default": the server's (``--prompt-syntax plain``: "None") or else the
    family's; the family's own name is kept as "default" (the PNG text names only another)."""
    value = choice("emphasis", value, (DEFAULT_EMPHASIS, *EMPHASES))
    syntax, family = getattr(limits, "prompt_syntax", "a1111"), getattr(limits, "family", "")
    if value == DEFAULT_EMPHASIS and syntax == "plain":
        return "None"
    if syntax == "a1111" and value == family_emphasis(family):
        return DEFAULT_EMPHASIS
    return value


TABLE: tuple[Field, ...] = (
    Field("prompt", str, REQUIRED, 'What to draw, in plain English (for the default model, e.g. "a red circle on a '
          'blue background").', a1111="prompt", openai="prompt"),
    Field("negative_prompt", str, REQUIRED, "What to avoid; may be empty.", a1111="negative_prompt",
          openai="extra_body", png="Negative prompt"),
    Field("seed", float, REQUIRED, "Seed of the first image (image i uses seed + i); ignored when randomize_seed "
          "is true.", a1111="seed", openai="extra_body", png="Seed"),
    Field("randomize_seed", bool, REQUIRED, "Pick a random seed (and report it in the info record).",
          a1111="seed"),
    Field("width", float, REQUIRED, "Image width in pixels, a multiple of the model's size step.", a1111="width",
          openai="size", png="Size"),
    Field("height", float, REQUIRED, "Image height in pixels, a multiple of the model's size step.",
          a1111="height", openai="size", png="Size"),
    Field("num_inference_steps", float, REQUIRED, "Denoising steps; more is slower and usually finer.",
          a1111="steps", openai="extra_body", png="Steps"),
    Field("guidance_scale", float, REQUIRED, "How strictly to follow the prompt (classifier-free guidance).",
          a1111="cfg_scale", openai="extra_body", png="CFG scale"),
    Field("num_images", float, REQUIRED, "How many images to generate.", a1111="batch_size", openai="n"),
    Field("live_preview", bool, REQUIRED, "Stream rough preview images while denoising.",
          openai="partial_images"),
    Field("scheduler", str, REQUIRED, 'The sampler: "default" (the model\'s own) or one of the names the model '
          "offers\n(Euler, Euler a, DPM++ 2M Karras, DDIM, UniPC where its family supports them).",
          a1111="sampler_name", openai="extra_body", png="Sampler"),
    Field("lora", str, "none", 'A LoRA the server loaded (--lora), by name, or "none".',
          a1111="prompt", openai="extra_body", png="Lora hashes"),
    Field("lora_scale", float, 1.0, "How strongly the LoRA applies, from -2 to 2 (1: as trained).",
          a1111="prompt", openai="extra_body"),
    Field("mode", str, "text", '"text" (text-to-image), or, where the model has them, "image" (image-to-image),'
          '\n"inpaint" or "outpaint".', a1111="init_images"),
    Field("image", Any, None, "The picture an image mode starts from: an image you uploaded (PNG, JPEG or WebP;"
          '\ngradio_client: handle_file("photo.png")); resized to width x height.', modes=IMAGE_MODES,
          a1111="init_images", openai="image"),
    Field("mask", Any, None, "Inpainting's mask, an uploaded image: white (or painted) where the picture is "
          "redrawn.", modes=("inpaint",), a1111="mask", openai="mask"),
    Field("strength", float, 0.75, "How far an image mode redraws its picture, above 0 and at most 1.",
          modes=IMAGE_MODES, a1111="denoising_strength", openai="extra_body", png="Denoising strength"),
    Field("outpaint_left", float, 0, "Outpainting: pixels added on the left (a multiple of the size step).",
          modes=("outpaint",)),
    Field("outpaint_top", float, 0, "Outpainting: pixels added on top.", modes=("outpaint",)),
    Field("outpaint_right", float, 0, "Outpainting: pixels added on the right.", modes=("outpaint",)),
    Field("outpaint_bottom", float, 0, "Outpainting: pixels added at the bottom.", modes=("outpaint",)),
    Field("mask_blur", float, 4, "Pixels the mask's edge is softened by (inpainting and outpainting), 0 to 64.",
          modes=("inpaint", "outpaint"), a1111="mask_blur", png="Mask blur"),
    Field("hires_fix", bool, False, "Text mode: upscale the picture and redraw it at the larger size.",
          modes=("text",), a1111="enable_hr"),
    Field("hires_scale", float, 2.0, "Hires fix's upscale, 1.5 or 2.", modes=("text",), a1111="hr_scale",
          png="Hires upscale"),
    Field("hires_strength", float, 0.5, "How far hires fix redraws the upscaled picture, 0 to 1 (0: upscaled only).",
          modes=("text",), a1111="denoising_strength", png="Denoising strength"),
    Field("hires_steps", float, 0, "Hires fix's steps (0: the request's own).", modes=("text",),
          a1111="hr_second_pass_steps", png="Hires steps"),
    Field("step_cache", str, STEP_CACHE_DEFAULT, 'Step caching: "default" (the server\'s), "off" (every step '
          'computed), "auto" (the model\'s recommended method) or a method it offers ("taylorseer": steps between '
          'computed ones extrapolated from the last two; "reuse": the last output again), faster for a little '
          "detail.", a1111="override_settings.step_cache", openai="extra_body", png="Step cache",
          check=_step_cache, unwritten=(STEP_CACHE_OFF,)),
    Field("emphasis", str, DEFAULT_EMPHASIS, "How AUTOMATIC1111's prompt syntax reads: \"default\" (the server's: "
          "(word:1.2), [word] and BREAK read, CLIP prompts of any length in chunks of 75 tokens), \"Original\" "
          "(weights, the mean restored), \"No norm\" (weights alone) or \"None\" (the prompt as written).",
          a1111="override_settings.emphasis", openai="extra_body", png="Emphasis", check=_emphasis),
    Field("control", str, NONE, 'A ControlNet the server loaded (--controlnet; /health\'s "controls"), by name, or '
          '"none": a map (control_image) says where things go.', modes=CONTROL_MODES, openai="extra_body",
          check=_control, unwritten=(NONE,)),
    Field("control_image", Any, None, "The control's map, an uploaded image (PNG, JPEG or WebP): for the "
          "embedded model's \"shapes\", white where the shape goes, on black; resized to width x height.",
          modes=CONTROL_MODES, openai="extra_body"),
    Field("control_scale", float, 1.0, "How strongly the control acts, 0 to 2 (0: as without it).",
          modes=CONTROL_MODES, openai="extra_body", check=_fraction("control_scale", 2.0)),
    Field("control_start", float, 0.0, "The fraction of the steps after which the control starts acting, 0 to 1.",
          modes=CONTROL_MODES, openai="extra_body", check=_fraction("control_start")),
    Field("control_end", float, 1.0, "The fraction of the steps after which it stops, control_start to 1.",
          modes=CONTROL_MODES, openai="extra_body", check=_fraction("control_end")),
    Field("control_preprocess", str, "none", 'How the upload becomes the map: "none" (it is the map), "canny" '
          '(edges drawn from a picture) or "invert" (a dark sketch on white).', modes=CONTROL_MODES,
          openai="extra_body", check=_preprocess),
    Field("model", str, DEFAULT_MODEL, 'The model to draw with, by name (/health\'s "models"; the server\'s --model '
          'names), or "default": the server\'s first (AUTOMATIC1111\'s options may set your own).',
          a1111="override_settings.sd_model_checkpoint", openai="model", png="Model", check=_model, unwritten=("",)),
)  # fmt: skip
BY_NAME: dict[str, Field] = {f.name: f for f in TABLE}
NAMES: tuple[str, ...] = tuple(f.name for f in TABLE)
TABLE_FIELDS: tuple[Field, ...] = tuple(f for f in TABLE if f.check is not None)


def defaults() -> dict[str, Any]:
    """The declared defaults of the fields that have one."""
    return {f.name: f.default for f in TABLE if f.default is not REQUIRED}


def checked(raw: Mapping[str, Any], limits: Any) -> tuple[tuple[str, Any], ...]:
    """The table fields of ``raw``, each checked by its row (a missing one: its default)."""
    return tuple((f.name, f.check(raw.get(f.name, f.default), limits)) for f in TABLE_FIELDS if f.check)


# -- what the wire formats and the PNG text read ---------------------------------------------------
def a1111_names() -> dict[str, str]:
    """The app's field names in its errors as the AUTOMATIC1111 field a client sent (where they differ)."""
    return {f.name: f.a1111 for f in TABLE if f.a1111 and f.a1111 != f.name}


def passed_through(protocol: str) -> tuple[str, ...]:
    """The fields a wire format takes under the app's own names: OpenAI's extra body fields
    (``extra_body``), A1111's ``override_settings`` keys."""
    if protocol == "openai":
        return tuple(f.name for f in TABLE if f.openai == "extra_body")
    return tuple(f.name for f in TABLE if f.a1111 == f"override_settings.{f.name}")


def png_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """The table fields of an info record's parameters for the PNG text: those not at their default."""
    return {
        f.png: params[f.name]
        for f in TABLE_FIELDS
        if f.png and params.get(f.name, f.default) not in (f.default, *f.unwritten)
    }


def pasted(settings: Mapping[str, str], limits: Any) -> tuple[dict[str, Any], list[str]]:
    """The table fields a pasted settings line names, each checked; a note for each it cannot take."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    for f in TABLE_FIELDS:
        if f.png in settings and f.check is not None:
            try:
                values[f.name] = f.check(settings[f.png], limits)
            except InvalidRequest as exc:
                notes.append(f"{f.png}: {settings[f.png]!r} not applied: {exc}")
    return values, notes


def png_keys() -> set[str]:
    """The PNG text keys the table's fields are read back from."""
    return {f.png for f in TABLE_FIELDS if f.png}


# -- the handler's signature -----------------------------------------------------------------------
def signature(extra: list[inspect.Parameter]) -> inspect.Signature:
    """The generate handler's signature: one parameter a field, in the table's order, then ``extra``
    (what Gradio injects: the progress tracker, the request, the OAuth profile)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(f.name, kind, default=f.default, annotation=f.type) for f in TABLE]
    return inspect.Signature([*params, *extra])


def docstring(summary: str) -> str:
    """``summary``, then an ``Args:`` section from the table (Gradio's API page and MCP read it)."""
    lines = [summary, "", "Args:"]
    for f in TABLE:
        first, *rest = f.doc.split("\n")
        lines.append(f"    {f.name}: {first}")
        lines += [f"        {line}" for line in rest]
    return "\n".join(lines) + "\n"


def raw_from(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The raw request from the handler's bound arguments: the fields, in the table's order."""
    return {name: arguments[name] for name in NAMES}


# -- the text encoders' windows ----------------------------------------------------------------------
# Whether a prompt fits its text encoders' windows, and the note for one that does not. Pure.
#
# ``fits_every_window`` answers without counting (most prompts are short enough), and
# ``truncation_notes`` words the note for each encoder that cuts a counted text.


def fits_every_window(text: str, encoders: tuple[tuple[str, int], ...]) -> bool:
    """Whether ``text`` is surely within every text encoder's window, without counting its tokens.

    Every tokenizer of these model families spends at least one character of an ASCII text on each
    token: CLIP's byte-level BPE, and T5's and Gemma's SentencePiece, whose one exception is the
    word marker it puts before the first word. So an ASCII text of n characters is at most n + 1
    tokens (``tests/unit/test_request.py`` checks it on each family's tokenizer). Counting a prompt
    costs a round trip to the model process; most prompts are short enough to need none.
    A ByT5 glyph encoder (HunyuanImage) reads the quoted text formatted as ``Text "...". ``: at
    most five bytes for each character of the prompt (an empty ``""`` becomes ten), so its window
    counts a fifth.
    """
    windows = [limit // 5 if name == "ByT5" else limit for name, limit in encoders]
    return bool(encoders) and text.isascii() and len(text) + 1 <= min(windows)


def truncation_notes(field: str, tokens: Mapping[str, int], encoders: tuple[tuple[str, int], ...]) -> list[str]:
    """One note per text encoder that cut the text, naming it (CLIP reads 75 tokens, T5 its own length)."""
    notes = []
    for encoder, limit in dict(encoders).items():
        if (n := tokens.get(encoder, 0)) > limit:
            others = [f"{e} reads up to {lim}" for e, lim in dict(encoders).items() if e != encoder and lim >= n]
            rest = f" ({'; '.join(others)})" if others else ""
            what = f"{field}'s quoted text" if encoder == "ByT5" else field  # the glyphs HunyuanImage draws
            notes.append(
                f"{what} is {n} tokens; the {encoder} text encoder reads the first {limit}, "
                f"so it ignored the rest{rest}"
            )
    return notes


# -- text as text -------------------------------------------------------------------------------------
# Text as the app takes it, in every text field of every event: valid Unicode, no control characters.
#
# A string from JSON may hold what no encoder can write: a lone surrogate (``"\\ud800"``) passes
# Python's JSON reader and then fails deep inside a tokenizer, as a server fault. So every text is
# checked where it enters (the front door for every event, ``request.validate`` for ``/generate``):
#
# - it must encode as UTF-8 (no unpaired surrogate), else it is refused, naming the field;
# - a carriage return is a line break: ``\\r\\n`` and ``\\r`` become ``\\n``;
# - any other control character but newline and tab (C0, DEL, C1) is refused, naming the field and
#   the character, since it is never part of a prompt a person wrote.
#
# Pure functions.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_RETURNS = re.compile(r"\r\n?")


def text_problem(value: str) -> str | None:
    """Why ``value`` is not text the app takes (to follow the field's name), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"must be valid Unicode text (an unpaired surrogate at character {exc.start + 1})"
    control = _CONTROL.search(_RETURNS.sub("\n", value))
    if control is not None:
        char = control.group()
        return (
            f"must not contain control characters (U+{ord(char):04X} at character {control.start() + 1}); "
            "line breaks and tabs are fine"
        )
    return None


def normalized(value: str) -> str:
    """``value`` with every carriage return written as a newline (the one change made to a text)."""
    return _RETURNS.sub("\n", value) if "\r" in value else value

"""AUTOMATIC1111 "parameters" text -> values for the page's controls, and a note for whatever is not applied.

The format is the one ``serving.postprocess.a1111_parameters`` writes into every PNG, and what
AUTOMATIC1111, Forge, Fooocus' A1111 mode and civitai write::

    a prompt, maybe on
    several lines
    Negative prompt: what to avoid
    Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x768, Model: x

Parsing follows A1111's own ``parse_generation_parameters``: the last line is the settings line
when it holds at least three ``Key: value`` pairs (a value in double quotes, JSON-escaped, may hold
commas, colons and newlines: A1111's ``quote``); lines before ``Negative prompt:`` are the prompt,
the rest the negative prompt. The settings line is read by a scanner that visits each character
once: A1111's regular expression backtracks, and on a long line with no ``:`` it took 1.8 s for 16k
characters (quadratic). Pure functions.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ... import fields
from ...errors import InvalidRequest
from ...fields import number
from ...loras import NONE, SCALE_MAX, SCALE_MIN, strip_tags
from ...request import HIRES_SCALES, HIRES_UPSCALER, MAX_MASK_BLUR, MAX_SEED, Limits

_KEY = re.compile(r"\w[\w \-/+.]*")  # a settings key: checked with fullmatch on a short slice (linear)
_SIZE = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*$")
_NEGATIVE = "Negative prompt:"
# Keys this app reads; every other key of the settings line is listed as "not used".
_READ = {"Steps", "Sampler", "Schedule type", "CFG scale", "Seed", "Size", "Model", "Lora hashes", "RNG",
         "Denoising strength", "Mask blur", "Hires upscale", "Hires steps", "Hires upscaler", "ControlNet 0",
         *fields.png_keys()}  # fmt: skip
# A ControlNet unit's keys (``ControlNet 0: "Module: canny, Model: shapes, Weight: 1, ..."``) and our fields.
_UNIT = {"Module": "control_preprocess", "Model": "control", "Weight": "control_scale",
         "Guidance Start": "control_start", "Guidance End": "control_end"}  # fmt: skip


@dataclass(frozen=True)
class Pasted:
    """A parameters text, parsed: the prompt, the negative prompt and the settings line's pairs."""

    prompt: str
    negative_prompt: str
    settings: dict[str, str] = field(default_factory=dict)  # in the text's order, quotes removed


@dataclass(frozen=True)
class Fill:
    """What to put into the controls (the API's field names, plus ``scheduler``) and why not the rest."""

    values: dict[str, Any]
    notes: list[str]


def parse_parameters(text: str) -> Pasted:
    """Split a parameters text into prompt, negative prompt and the settings line's ``key: value`` pairs."""
    *lines, last = text.strip().replace("\r\n", "\n").split("\n")
    pairs = settings_pairs(last)
    if len(pairs) < 3:
        lines.append(last)
        pairs = []
    prompt: list[str] = []
    negative: list[str] = []
    for line in lines:
        line = line.strip()
        if not negative and line.startswith(_NEGATIVE):
            negative.append(line[len(_NEGATIVE) :].strip())
        elif negative:
            negative.append(line)
        else:
            prompt.append(line)
    settings = {key: value for key, value in pairs}
    return Pasted("\n".join(prompt).strip(), "\n".join(negative).strip(), settings)


def settings_pairs(line: str) -> list[tuple[str, str]]:
    """The ``Key: value`` pairs of a settings line, in order; each character is looked at once or twice.

    A pair is ``Key: value`` up to the next comma; a value that starts with a double quote runs to
    the closing quote (backslash escapes, then JSON-decoded, as A1111's ``quote`` writes it) and may
    hold commas. A stretch with no colon, or whose key is not a name, is skipped, as A1111 skips it.
    """
    pairs: list[tuple[str, str]] = []
    i, n, colon = 0, len(line), -1
    while i < n:
        if colon < i:  # the next colon, looked for again only once it is behind us: each character once
            colon = line.find(":", i)
        comma = line.find(",", i)
        if colon < 0:
            break
        if 0 <= comma < colon:  # no colon before this comma: not a pair
            i = comma + 1
            continue
        key = line[i:colon].strip()
        j = colon + 1
        while j < n and line[j] in " \t":
            j += 1
        if j < n and line[j] == '"':
            end = _closing_quote(line, j)
            raw = line[j : end + 1] if end > 0 else line[j:]
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw.strip('"')
            comma = line.find(",", end + 1) if end > 0 else -1
        else:
            comma = line.find(",", j)
            value = (line[j:comma] if comma >= 0 else line[j:]).strip()
        if _KEY.fullmatch(key):
            pairs.append((key, value))
        if comma < 0:
            break
        i = comma + 1
    return pairs


def _closing_quote(line: str, start: int) -> int:
    """The index of the quote that closes the one at ``start`` (backslash escapes skipped); -1 if none."""
    i = start + 1
    while i < len(line):
        if line[i] == "\\":
            i += 2
        elif line[i] == '"':
            return i
        else:
            i += 1
    return -1


def fill_from(
    pasted: Pasted,
    limits: Limits,
    *,
    samplers: Sequence[str] | None = None,
    model: str | None = None,
    lora_hashes: dict[str, str] | None = None,
) -> Fill:
    """The values of ``pasted`` this model can take, each checked against ``limits``; a note per other field.

    ``samplers``: the page's sampler choices (None: the page has no sampler control). A value
    outside this model's range is not applied (the control keeps its value) and gets a note that
    names the field, the value and the range.
    """
    values: dict[str, Any] = {}
    notes: list[str] = []
    s = pasted.settings
    if not pasted.prompt and not s:
        return Fill(
            {},
            [
                "Nothing to apply: paste a parameters text (a prompt, then a line like "
                "“Steps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512”)."
            ],
        )
    served = s.get("Model") if s.get("Model") in limits.served else None  # several models (issue 52): that one
    if served is not None and len(limits.served) > 1:
        limits, values["model"] = limits.pick(served), served
    prompt, tags = strip_tags(pasted.prompt)  # A1111 writes the LoRA into the prompt: <lora:NAME:SCALE>
    pasted = Pasted(prompt, pasted.negative_prompt, s)
    _prompt(pasted, limits, values, notes)
    _lora(tags, s.get("Lora hashes", ""), limits, lora_hashes or {}, values, notes)
    if not s:
        notes.append(
            "No settings line (“Steps: …, Sampler: …, CFG scale: …, Seed: …, Size: …”) was found; "
            "only the prompt was filled."
        )
        return Fill(values, notes)
    if "Steps" in s:
        steps = _number(s["Steps"], integer=True)
        if steps is not None and limits.min_steps <= steps <= limits.max_steps:
            values["num_inference_steps"] = int(steps)
        else:
            notes.append(
                f"Steps: {s['Steps']!r} not applied: this model takes a whole number "
                f"from {limits.min_steps} to {limits.max_steps}."
            )
    if "CFG scale" in s:
        cfg = _number(s["CFG scale"])
        if cfg is not None and limits.min_guidance <= cfg <= limits.max_guidance:
            values["guidance_scale"] = cfg
        else:
            notes.append(
                f"CFG scale: {s['CFG scale']!r} not applied: this model takes "
                f"{limits.min_guidance:g} to {limits.max_guidance:g}."
            )
    if "Seed" in s:
        seed = _number(s["Seed"], integer=True)
        if seed is not None and 0 <= seed <= MAX_SEED:
            values["seed"], values["randomize_seed"] = int(seed), False
        else:
            notes.append(f"Seed: {s['Seed']!r} not applied: a seed is a whole number from 0 to {MAX_SEED}.")
    if "Size" in s:
        _size(s["Size"], limits, values, notes)
    if "Sampler" in s:
        _sampler(s["Sampler"], s.get("Schedule type", ""), samplers, values, notes)
    _mode(s, limits, values, notes)
    if "ControlNet 0" in s:
        _control_unit(s["ControlNet 0"], limits, values, notes)
    table_values, table_notes = fields.pasted({k: v for k, v in s.items() if k != "Model"}, limits)  # the table's
    values.update(table_values)
    notes += table_notes
    if model and s.get("Model") and s["Model"] != model and served is None:
        notes.append(f"Model: the text names {s['Model']!r}; this app runs {model!r}, so the image will differ.")
    if s.get("RNG", "CPU").upper() != "CPU":
        notes.append(
            f"RNG: the text's noise came from {s['RNG']!r}; this app draws it on the CPU, so the image will differ."
        )
    unused = [key for key in s if (key not in _READ and not (key == "Model hash" and served))
              or (key == "Lora hashes" and not limits.loras)]  # fmt: skip
    if unused:
        notes.append("Not used by this app: " + ", ".join(unused) + ".")
    return Fill(values, notes)


def _control_unit(text: str, limits: Limits, values: dict[str, Any], notes: list[str]) -> None:
    """AUTOMATIC1111's first ControlNet unit: each key the control fields check; the map is not in the text."""
    unit = {key.strip(): value.strip() for key, _, value in (part.partition(":") for part in text.split(","))}
    for key, name in _UNIT.items():
        if key not in unit:
            continue
        row = fields.BY_NAME[name]
        raw: Any = unit[key] if row.type is str else _number(unit[key])
        try:
            values[name] = row.check(raw, limits) if row.check is not None else raw
        except InvalidRequest as exc:
            notes.append(f"ControlNet 0: {key} {unit[key]!r} not applied: {exc}")
    if values.get("control", NONE) != NONE:
        notes.append("ControlNet 0: its map is not in the text: upload it again as the control image.")


def _mode(s: dict[str, str], limits: Limits, values: dict[str, Any], notes: list[str]) -> None:
    """The mode the text was made in, as A1111 writes it: "Hires upscale" is text-to-image with hires
    fix (its "Denoising strength" is the second pass's); else "Denoising strength" is image-to-image
    ("Mask blur" too: inpainting); else text-to-image. Only a mode this model serves is applied."""
    strength = _number(s["Denoising strength"]) if "Denoising strength" in s else None
    if strength is not None and not 0 < strength <= 1:
        notes.append(f"Denoising strength: {s['Denoising strength']!r} not applied: it is above 0 and at most 1.")
        strength = None
    if "Hires upscale" in s:
        if "image" not in limits.modes:
            notes.append("Hires upscale: not applied: this model has no image-to-image pipeline for hires fix.")
            return
        values["mode"], values["hires_fix"] = "text", True
        scale = _number(s["Hires upscale"])
        if scale in HIRES_SCALES:
            values["hires_scale"] = scale
        else:
            notes.append(f"Hires upscale: {s['Hires upscale']!r} not applied: this app upscales by 1.5 or 2.")
        steps = _number(s.get("Hires steps", "0"), integer=True)
        if steps is not None and 0 <= steps <= limits.max_steps:
            values["hires_steps"] = int(steps)
        if strength is not None:
            values["hires_strength"] = strength
        if s.get("Hires upscaler", HIRES_UPSCALER) != HIRES_UPSCALER:
            notes.append(
                f"Hires upscaler: {s['Hires upscaler']!r} not applied: this app upscales with {HIRES_UPSCALER}, "
                "so the image will differ."
            )
        return
    mode = ("inpaint" if "Mask blur" in s else "image") if strength is not None else "text"
    if mode not in limits.modes:
        notes.append(f"Denoising strength: not applied: this model serves no {mode} mode.")
        return
    values["mode"] = mode
    if mode != "text":
        values["strength"] = strength
        blur = _number(s.get("Mask blur", ""), integer=True)
        if blur is not None and 0 <= blur <= MAX_MASK_BLUR:
            values["mask_blur"] = int(blur)
    if "hires_fix" not in values:
        values["hires_fix"] = False


_FIELD_NAMES = {
    "prompt": "prompt",
    "negative_prompt": "negative prompt",
    "num_inference_steps": "steps",
    "guidance_scale": "guidance",
    "seed": "seed",
    "width": "size",
    "scheduler": "sampler",
    "lora": "LoRA",
    "mode": "mode",
    "strength": "denoising strength",
    "hires_fix": "hires fix",
}


def notes_html(fill: Fill) -> str:
    """What was filled, then one line per field not applied (shown under the paste box).

    Plain text in HTML: every note quotes the pasted text, which is escaped, so a link, an image or
    markup in a paste is shown as the characters it is, never rendered or fetched.
    """
    filled = [name for key, name in _FIELD_NAMES.items() if key in fill.values]
    head = "<strong>Filled:</strong> " + ", ".join(filled) + "." if filled else "<strong>Nothing was filled.</strong>"
    items = "".join(f"<li>{html.escape(note)}</li>" for note in fill.notes)
    return f'<div class="t2i-notes"><p>{head}</p>' + (f"<ul>{items}</ul>" if items else "") + "</div>"


def _prompt(pasted: Pasted, limits: Limits, values: dict[str, Any], notes: list[str]) -> None:
    if not pasted.prompt:
        notes.append("Prompt: the text has none; the prompt box keeps its text.")
    elif len(pasted.prompt) > limits.max_prompt_chars:
        notes.append(
            f"Prompt not applied: it is {len(pasted.prompt)} characters; "
            f"this app takes at most {limits.max_prompt_chars}."
        )
    else:
        values["prompt"] = pasted.prompt
    negative = pasted.negative_prompt
    if negative and not limits.negative_prompt:
        notes.append("Negative prompt not applied: this model does not use one.")
    elif len(negative) > limits.max_prompt_chars:
        notes.append(
            f"Negative prompt not applied: it is {len(negative)} characters; "
            f"this app takes at most {limits.max_prompt_chars}."
        )
    else:
        values["negative_prompt"] = negative  # none in the text: the image was made without one


def _hashes(text: str) -> dict[str, str]:
    """Civitai's ``Lora hashes: "a: 0123abcd4567, b: ..."`` as {name: hash}."""
    pairs = (part.partition(":") for part in text.split(","))
    return {name.strip().lower(): digest.strip().lower() for name, _, digest in pairs if name.strip()}


def _lora(
    tags: list[tuple[str, float]],
    hashes_text: str,
    limits: Limits,
    our_hashes: dict[str, str],
    values: dict[str, Any],
    notes: list[str],
) -> None:
    """The pasted ``<lora:NAME:SCALE>`` selects that LoRA; none in the text selects none."""
    if not limits.loras:
        if tags:
            notes.append(f"LoRA {tags[0][0]!r} not applied: this app loaded no LoRAs.")
        return
    by_lower = {name.lower(): name for name in limits.loras}
    known = [(by_lower[n.lower()], s) for n, s in tags if n.lower() in by_lower]
    for name, _ in tags:
        if name.lower() not in by_lower:
            notes.append(f"LoRA {name!r} not applied: this app has {', '.join((NONE, *limits.loras))}.")
    if not tags:
        values["lora"] = NONE  # the image was made without one
        return
    if not known:
        return
    name, scale = known[0]
    if len(tags) > 1:
        notes.append(f"Only LoRA {name!r} applied: this app runs one LoRA per image.")
    values["lora"] = name
    if SCALE_MIN <= scale <= SCALE_MAX:
        values["lora_scale"] = scale
    else:
        notes.append(f"LoRA scale {scale:g} not applied: this app takes {SCALE_MIN:g} to {SCALE_MAX:g}.")
    theirs, ours = _hashes(hashes_text).get(name.lower()), our_hashes.get(name, "")
    if theirs and ours and theirs != ours.lower():
        notes.append(f"LoRA {name!r}: the text's file hash is {theirs}, this app's is {ours}; the image will differ.")


def _size(text: str, limits: Limits, values: dict[str, Any], notes: list[str]) -> None:
    match = _SIZE.match(text)
    m, lo, hi = limits.size_multiple, limits.min_size, limits.max_size
    rule = f"this model takes multiples of {m} from {lo} to {hi}, at most {limits.max_pixels} pixels"
    if match is None:
        notes.append(f"Size: {text!r} not applied: expected WIDTHxHEIGHT, e.g. 512x768.")
        return
    width, height = int(match[1]), int(match[2])
    fits = all(lo <= n <= hi and n % m == 0 for n in (width, height)) and width * height <= limits.max_pixels
    if fits:
        values["width"], values["height"] = width, height
    else:
        notes.append(f"Size: {width}x{height} not applied: {rule}.")


# AUTOMATIC1111's own aliases of its samplers (``sd_samplers_kdiffusion``, ``sd_samplers_timesteps``),
# which old clients and scripts send: k_euler_a is "Euler a".
SAMPLER_ALIASES = {
    "k_euler_a": "Euler a", "k_euler_ancestral": "Euler a", "k_euler": "Euler", "k_lms": "LMS", "k_heun": "Heun",
    "k_dpm_2": "DPM2", "k_dpm_2_a": "DPM2 a", "k_dpmpp_2s_a": "DPM++ 2S a", "k_dpmpp_2m": "DPM++ 2M",
    "k_dpmpp_sde": "DPM++ SDE", "k_dpmpp_2m_sde": "DPM++ 2M SDE", "k_dpm_fast": "DPM fast",
    "k_dpm_ad": "DPM adaptive", "k_lms_ka": "LMS Karras", "k_dpm_2_ka": "DPM2 Karras",
    "k_dpm_2_a_ka": "DPM2 a Karras", "k_dpmpp_2s_a_ka": "DPM++ 2S a Karras", "k_dpmpp_2m_ka": "DPM++ 2M Karras",
    "k_dpmpp_sde_ka": "DPM++ SDE Karras", "ddim": "DDIM", "plms": "PLMS", "unipc": "UniPC",
}  # fmt: skip


def sampler_key(name: str) -> str:
    """A sampler's name for matching: "DPM++ 2M (Karras)", "DPM++ 2M Karras" and "dpm++ 2m karras" are one,
    and so are A1111's aliases ("k_dpmpp_2m_ka")."""
    name = SAMPLER_ALIASES.get(name.strip().lower(), name)
    return re.sub(r"[^a-z0-9]", "", name.lower())


def match_sampler(name: str, choices: Sequence[str]) -> str | None:
    """The choice that is sampler ``name`` (spelling aside); "default (Euler)", the model's own, is also "Euler"."""
    keyed = {sampler_key(choice): choice for choice in choices}
    for choice in choices:
        if (own := re.fullmatch(r"default \((.+)\)", choice)) is not None:
            keyed.setdefault(sampler_key(own[1]), choice)
    return keyed.get(sampler_key(name))


def _sampler(
    name: str, schedule: str, samplers: Sequence[str] | None, values: dict[str, Any], notes: list[str]
) -> None:
    if samplers is None:
        notes.append(f"Sampler: {name!r} not applied: this page has no sampler choice.")
        return
    wanted = [name]
    if schedule and schedule.lower() not in ("automatic", "uniform", "normal") and schedule.lower() not in name.lower():
        wanted.insert(0, f"{name} {schedule}")  # A1111 1.9+ writes "Sampler: DPM++ 2M, Schedule type: Karras"
    for candidate in wanted:
        if (choice := match_sampler(candidate, samplers)) is not None:
            values["scheduler"] = choice
            return
    shown = f"{name} ({schedule})" if schedule else name
    notes.append(f"Sampler: {shown!r} not applied: this model offers {', '.join(samplers) or 'no choice'}.")


def _number(text: str, *, integer: bool = False) -> float | None:
    try:
        return number("", text, whole=integer, text=True)
    except InvalidRequest:
        return None

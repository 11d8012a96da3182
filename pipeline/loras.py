"""LoRAs as the app names them: ``--lora NAME=PATH_OR_HUB_ID[:SCALE]``, free of torch.

The specs are parsed here (by ``config``, at start, so a bad one stops the app with its reason);
``engine.model.lora`` loads them into the pipeline. A request names a LoRA by ``NAME`` (``"none"``:
no LoRA) and a ``lora_scale``; ``:SCALE`` is the LoRA's own recommended scale, the one the
page's slider moves to when the LoRA is picked.

The PNG metadata follows AUTOMATIC1111: ``<lora:NAME:SCALE>`` in the prompt line, and Civitai's
``Lora hashes: "NAME: HASH"``, where HASH is the first 12 hex digits of the SHA-256 of the
safetensors file's tensor data (the bytes after its JSON header: A1111's "addnet" hash, Civitai's
AutoV3), so editing a file's metadata does not change it.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from .protocol import NONE

SCALE_MIN, SCALE_MAX = -2.0, 2.0  # lora_scale's range (negative: "slider" LoRAs that take a trait away)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# A1111's prompt tag: <lora:NAME:SCALE> (SCALE optional, 1 by default). Linear on any text: the
# name's and the number's runs are possessive and cannot overlap, so no failed match is retried
# another way (``[0-9]*\.?[0-9]+`` split a run of digits every way before giving up: quadratic).
_NUMBER = r"-?(?:[0-9]++(?:\.[0-9]++)?|\.[0-9]++)"
TAG = re.compile(rf"<lora:([^:<>]++)(?::({_NUMBER}))?>", re.IGNORECASE)


@dataclass(frozen=True)
class LoraSpec:
    """One ``--lora`` value: the name requests use, where the weights are, and the recommended scale."""

    name: str
    source: str  # a local file or folder, or a hub id (optionally with a file: user/repo/file.safetensors)
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """``NAME=PATH_OR_HUB_ID[:SCALE]``; raises ``ValueError`` naming what is wrong."""
        name, eq, rest = text.strip().partition("=")
        name = name.strip()
        if not eq or not rest.strip():
            raise ValueError(f"--lora must be NAME=PATH_OR_HUB_ID[:SCALE]; got {text!r}")
        if name.lower() == NONE or not _NAME.fullmatch(name):
            raise ValueError(
                f"--lora name {name!r} must be 1 to 64 letters, digits, '_', '.' or '-' (not starting with "
                f"one of the last three), and not {NONE!r}"
            )
        source, scale = rest.strip(), 1.0
        head, colon, tail = source.rpartition(":")
        if colon and head and re.fullmatch(_NUMBER, tail.strip()):
            source, scale = head.strip(), float(tail)
        if not (math.isfinite(scale) and SCALE_MIN <= scale <= SCALE_MAX):
            raise ValueError(f"--lora {name}: the scale must be between {SCALE_MIN:g} and {SCALE_MAX:g}; got {scale:g}")
        return cls(name, source, scale)


def parse_all(texts: tuple[str, ...] | list[str]) -> tuple[LoraSpec, ...]:
    """Every spec, each name once (a second use of a name is an error, not a silent override)."""
    specs = tuple(LoraSpec.parse(t) for t in texts if t.strip())
    seen: set[str] = set()
    for spec in specs:
        if spec.name.lower() in seen:
            raise ValueError(f"--lora name {spec.name!r} is given twice; each LoRA needs its own name")
        seen.add(spec.name.lower())
    return specs


def split_env(value: str) -> list[str]:
    """``T2I_LORAS``: specs separated by commas or line breaks."""
    return [part for chunk in value.splitlines() for part in chunk.split(",") if part.strip()]


def short_hash(path: Path) -> str:
    """A1111's LoRA short hash: SHA-256 of a safetensors file's data after its header, first 12 hex digits
    (any other file: of the whole file)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        if path.suffix == ".safetensors":
            head = f.read(8)
            if len(head) == 8:
                f.seek(8 + struct.unpack("<Q", head)[0])
            else:
                f.seek(0)
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def prompt_tag(name: str, scale: float) -> str:
    """``<lora:NAME:SCALE>``, the way A1111 writes a LoRA into a prompt."""
    return f"<lora:{name}:{scale:g}>"


def strip_tags(prompt: str) -> tuple[str, list[tuple[str, float]]]:
    """The prompt without its ``<lora:...>`` tags, and the (name, scale) of each (A1111's paste)."""
    found = [(m.group(1).strip(), float(m.group(2)) if m.group(2) else 1.0) for m in TAG.finditer(prompt)]
    items = TAG.sub("", prompt).split(",")
    # "a, <lora:x:1>, b" -> "a, b": a run of commas with only spaces between them (what a tag leaves)
    # becomes one ", ", in one pass over the items (no pattern over runs of spaces: linear)
    text, gap = items[0], False
    for item in items[1:]:
        if not item.strip():
            gap = True
        elif gap:
            text, gap = f"{text.rstrip()}, {item.lstrip()}", False
        else:
            text += "," + item
    return text.strip().strip(",").strip(), found

"""Several models on one server (issue 52), as the app names them, free of torch.

``--model NAME=ID_OR_PATH`` may be given more than once; the first is the default model (what a
request gets unless it names another). A name defaults from the source: a local folder's name, a hub
id as written, ``embedded-default`` for the embedded model (no ``--model``, or ``--model
embedded-default``). Requests pick a model by that name (the ``model`` field; ``"default"``: the
caller's default, else the first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .fields import DEFAULT_MODEL

DEFAULT_NAME = "embedded-default"  # the embedded model's name (``ModelProfile.model_id`` of its profile)
DEFAULT = DEFAULT_MODEL  # a request's ``model`` value for its default model
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class ModelSpec:
    """One ``--model`` value: the name requests use (``named``: given as ``NAME=``) and the source
    (a hub id or a local path; None: the embedded default model)."""

    name: str
    source: str | None
    named: bool = False

    @classmethod
    def parse(cls, text: str | None) -> ModelSpec:
        """``NAME=ID_OR_PATH`` or ``ID_OR_PATH``; raises ``ValueError`` naming what is wrong."""
        if text is None or not text.strip() or text.strip() == DEFAULT_NAME:
            return cls(DEFAULT_NAME, None)
        head, eq, rest = text.strip().partition("=")
        if eq and _NAME.fullmatch(head.strip()) and rest.strip() and not Path(text.strip()).exists():
            name = head.strip()
            if name.lower() == DEFAULT:
                raise ValueError(f'--model name {name!r} is reserved: a request\'s "default" means its default model')
            source = rest.strip()
            return cls(name, None if source == DEFAULT_NAME else source, named=True)
        return cls(default_name(text.strip()), text.strip())


def default_name(source: str) -> str:
    """A model's name from its source: a local folder's name, else the hub id (``user/repo``) as written."""
    path = Path(source)
    return path.name if path.exists() and path.name else source


def parse_all(texts: tuple[str, ...] | list[str]) -> tuple[ModelSpec, ...]:
    """Every ``--model``, each name once (two models under one name would leave one unreachable)."""
    specs = tuple(ModelSpec.parse(t) for t in texts if t.strip())
    seen: dict[str, str] = {}
    for spec in specs:
        key = spec.name.lower()
        if key in seen:
            raise ValueError(f"--model name {spec.name!r} is given twice; name each model (NAME=ID_OR_PATH)")
        seen[key] = spec.name
    return specs

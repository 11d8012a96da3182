"""The default model's folder: where it lives, its build stamp, and the checks serving relies on.

A model built here is a ``save_pretrained`` folder plus ``default_model_build.json`` (the stamp:
build version, trained or not, seed, the generation defaults, the training report). This module
reads and writes that folder with the standard library only, so serving can find the model and its
defaults without importing torch; the weights themselves come from ``architecture`` (untrained) or
``train`` (trained).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "default-model"
# Its ControlNet, trained here (``control``), and the name the server gives it (issue 51).
DEFAULT_CONTROL_DIR = DEFAULT_MODEL_DIR.parent / "default-controlnet"
CONTROL_NAME = "shapes"
# Bump when the architecture or the tokenizer (``architecture.py``) changes, so stale builds are rebuilt.
BUILD_VERSION = 2
STAMP = "default_model_build.json"


class DefaultModelMissing(FileNotFoundError):
    """The shipped weights are missing or from an older architecture."""


def read_stamp(path: Path) -> dict[str, Any]:
    """The folder's build stamp; {} when it has none (or an unreadable one)."""
    try:
        return json.loads((Path(path) / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def is_current(path: Path, trained: bool = True) -> bool:
    stamp = read_stamp(path)
    return (
        stamp.get("version") == BUILD_VERSION
        and bool(stamp.get("trained")) == trained
        and (path / "model_index.json").exists()
    )


def model_defaults(path: Path) -> dict[str, Any]:
    """The generation defaults saved with a model trained here (guidance, steps); {} for any other."""
    defaults = read_stamp(Path(path)).get("defaults")
    return dict(defaults) if isinstance(defaults, dict) else {}


def ensure_default_model(path: Path = DEFAULT_MODEL_DIR) -> Path:
    """The shipped, trained default model; a clear error if it is not there."""
    if is_current(path):
        return path
    raise DefaultModelMissing(
        f"the embedded default model is missing or stale at {path} (expected trained weights, build "
        f"version {BUILD_VERSION}). Restore it with `git checkout -- {path.name}` inside assets/, retrain it "
        "with `python -m pipeline.default_model.train` (about 42 minutes on 2 CPU cores), or pass --model."
    )


def save_model(pipe: Any, path: Path, stamp: dict[str, Any]) -> Path:
    """``save_pretrained`` plus the build stamp, written to a temporary sibling folder and renamed
    into place, so a crash never leaves a half-written model that later loads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".default-model-", dir=path.parent))
    try:
        pipe.save_pretrained(tmp, safe_serialization=True)
        (tmp / STAMP).write_text(json.dumps({"version": BUILD_VERSION, **stamp}, indent=1))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path

"""The embedded default model: a tiny Stable-Diffusion-family pipeline, trained by this repo.

The model hub is not reachable from every machine this app runs on, so the default model lives in
the repo: ``assets/default-model/``, a ``save_pretrained`` folder that the app loads through the
same ``DiffusionPipeline.from_pretrained`` code as any hub model.

This package's top level is all serving imports, and it imports no torch, diffusers or drawing
code: the model's path, its check, its saved defaults and the UI's example prompts. The rest is
offline tooling, imported by its own module path:

- ``architecture``: the pipeline's configuration, built with seeded random weights;
- ``shapes``: the pictures it learns from, their captions and the model-free scorer;
- ``train``: ``python -m pipeline.default_model.train`` writes the trained folder;
- ``evaluate``: ``python -m pipeline.default_model.evaluate`` scores a model folder;
- ``folder``: the folder's build stamp, read and written;
- ``control``: ``python -m pipeline.default_model.control`` trains its ControlNet (issue 51).
"""

from __future__ import annotations

from .folder import (
    CONTROL_NAME,
    DEFAULT_CONTROL_DIR,
    DEFAULT_MODEL_DIR,
    DefaultModelMissing,
    ensure_default_model,
    model_defaults,
)
from .prompts import EXAMPLE_PROMPTS, GENERIC_PROMPTS

__all__ = [
    "CONTROL_NAME",
    "DEFAULT_CONTROL_DIR",
    "DEFAULT_MODEL_DIR",
    "EXAMPLE_PROMPTS",
    "GENERIC_PROMPTS",
    "DefaultModelMissing",
    "ensure_default_model",
    "model_defaults",
]

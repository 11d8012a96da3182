"""The image modes of a loaded pipeline: image-to-image and inpainting, from the same weights.

diffusers' ``AutoPipelineForImage2Image.from_pipe`` / ``AutoPipelineForInpainting.from_pipe`` build
the family's mode pipeline around the loaded pipeline's own components: no second load, no copy of
a weight, the LoRAs already in them. A mode is offered only where that pipeline is a
strength-based one (it takes ``image`` and ``strength``; ``mask_image`` for inpainting): FLUX.2's
and Kontext's "image-to-image" classes edit by reference instead, so the mode is refused there,
naming the class and why. Outpainting is inpainting on a wider canvas and hires fix is text, then
image-to-image at a larger size: they need no pipeline of their own.

Runs on the model thread (``engine.model.loading``), once, at load.
"""

from __future__ import annotations

import inspect
from typing import Any

MODES = ("text", "image", "inpaint")  # what an ``InferenceJob.mode`` may be
_NEEDS = {"image": ("image", "strength"), "inpaint": ("image", "mask_image", "strength")}
_WORDS = {"image": "image-to-image", "inpaint": "inpainting"}


def mode_pipelines(pipe: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``pipe``'s mode pipelines by mode (sharing its components), and why each missing mode is missing."""
    import diffusers
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    found: dict[str, Any] = {}
    missing: dict[str, str] = {}
    name = type(pipe).__name__
    for mode, auto in (("image", AutoPipelineForImage2Image), ("inpaint", AutoPipelineForInpainting)):
        words = _WORDS[mode]
        try:
            made = auto.from_pipe(pipe)
        except Exception as exc:  # no such class for this family in this diffusers
            reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            missing[mode] = f"{name} has no {words} pipeline in diffusers {diffusers.__version__} ({reason})"
            continue
        takes = inspect.signature(made.__call__).parameters
        if lacking := [arg for arg in _NEEDS[mode] if arg not in takes]:
            missing[mode] = (
                f"{name}'s {words} class, {type(made).__name__}, takes no {' or '.join(lacking)}: "
                "it edits by reference, not from a strength"
            )
            continue
        made.set_progress_bar_config(disable=True)
        found[mode] = made
    return found, missing


def takes_size(pipe: Any) -> bool:
    """Whether ``pipe.__call__`` takes ``width`` and ``height`` (SD's image-to-image draws at its image's size)."""
    takes = inspect.signature(pipe.__call__).parameters
    return "width" in takes and "height" in takes

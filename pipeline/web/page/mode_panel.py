"""The page's picture controls: the mode, the input image, the mask, strength, outpainting, hires fix.

Built from the profile: a mode the model lacks (``ModelProfile.modes``) is not offered. The input
image takes a file, a drag-and-drop and a paste from the clipboard (``gr.Image``'s upload and
clipboard sources); the mask is painted on the picture (``gr.ImageEditor``, its brush layer is the
mask) on the page, while the API's ``mask`` is a plain uploaded image. Each control shows only in
the modes that read it (``visible_for``), so a person never sets a value the request would refuse.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ...protocol import ModelProfile
from ...request import (
    DEFAULT_HIRES_STRENGTH,
    DEFAULT_MASK_BLUR,
    DEFAULT_STRENGTH,
    HIRES_SCALES,
    MAX_MASK_BLUR,
    PIPELINE_MODE,
    Limits,
)

MODE_LABELS = {"text": "Text to image", "image": "Image to image", "inpaint": "Inpaint", "outpaint": "Outpaint"}
# which controls each mode reads (the rest are hidden)
_SHOWN = {
    "text": {"hires"},
    "image": {"image", "strength", "slider"},
    "inpaint": {"editor", "strength", "mask_blur", "slider"},
    "outpaint": {"image", "strength", "mask_blur", "outpaint", "slider"},
}
GROUPS = ("image", "editor", "strength", "mask_blur", "outpaint", "hires", "slider")  # visible_for's order


def offered_modes(p: ModelProfile) -> list[str]:
    """The modes the page offers: those whose pipeline the model has (outpainting is inpainting's)."""
    return [mode for mode, needs in PIPELINE_MODE.items() if needs in p.modes]


def mode_controls(p: ModelProfile, lim: Limits) -> dict[str, Any]:
    """The controls, by the API's parameter names (``mask`` is the page's editor), and their groups."""
    modes = offered_modes(p)
    c: dict[str, Any] = {}
    c["mode"] = gr.Radio(
        [(MODE_LABELS[m], m) for m in modes], value="text", label="Mode", elem_id="mode", visible=len(modes) > 1
    )
    with gr.Group(visible=False, elem_id="image-group") as image_group:
        c["image"] = gr.Image(
            label="Input image (drop, upload or paste)",
            type="filepath",
            sources=["upload", "clipboard"],
            format="png",
            elem_id="input-image",
            height=280,
        )
    with gr.Group(visible=False, elem_id="editor-group") as editor_group:
        c["mask"] = gr.ImageEditor(
            label="Paint where the picture changes",
            type="filepath",
            sources=["upload", "clipboard"],
            brush=gr.Brush(colors=["#ffffff"], color_mode="fixed", default_size=24),
            eraser=gr.Eraser(default_size=24),
            layers=False,
            transforms=(),
            elem_id="mask-editor",
            height=320,
        )
        # The alternative to painting: a mask file (white redraws, black keeps), put in as the editor's
        # layer in the browser (``send_to.wire_mask_upload``); not an API input (the API's mask is a file).
        c["_mask_file"] = gr.Image(label="Or upload a mask (white: redrawn)", type="filepath",
                                   sources=["upload", "clipboard"], format="png", elem_id="mask-upload",
                                   height=140)  # fmt: skip
    c["strength"] = gr.Slider(0.05, 1.0, value=DEFAULT_STRENGTH, step=0.05, label="Denoising strength",
                              elem_id="strength", visible=False)  # fmt: skip
    c["mask_blur"] = gr.Slider(0, MAX_MASK_BLUR, value=DEFAULT_MASK_BLUR, step=1, label="Mask blur (px)",
                               elem_id="mask-blur", visible=False)  # fmt: skip
    step, most = lim.size_multiple, max(lim.size_multiple, lim.max_size // 2)
    with gr.Row(visible=False, elem_id="outpaint-row") as outpaint_row:
        for side in ("left", "top", "right", "bottom"):
            c[f"outpaint_{side}"] = gr.Slider(0, most, value=0, step=step, label=f"Extend {side} (px)",
                                              elem_id=f"outpaint-{side}", min_width=80)  # fmt: skip
    with gr.Accordion("Hires fix", open=False, visible="image" in p.modes, elem_id="hires") as hires:
        c["hires_fix"] = gr.Checkbox(False, label="Upscale and redraw at the larger size", elem_id="hires-fix")
        c["hires_scale"] = gr.Radio(list(HIRES_SCALES), value=2.0, label="Upscale by", elem_id="hires-scale")
        c["hires_strength"] = gr.Slider(0.05, 1.0, value=DEFAULT_HIRES_STRENGTH, step=0.05,
                                        label="Hires denoising strength", elem_id="hires-strength")  # fmt: skip
        c["hires_steps"] = gr.Slider(0, lim.max_steps, value=0, step=1, label="Hires steps (0: the same)",
                                     elem_id="hires-steps")  # fmt: skip
    c["_groups"] = {"image": image_group, "editor": editor_group, "strength": c["strength"],
                    "mask_blur": c["mask_blur"], "outpaint": outpaint_row, "hires": hires}  # fmt: skip
    return c


def visible_for(mode: str, has_hires: bool) -> list[Any]:
    """The groups' visibility for ``mode``, in ``GROUPS`` order (an event's outputs; "slider" is the
    result's before/after, made beside the gallery)."""
    shown = _SHOWN.get(mode, set())
    return [gr.update(visible=name in shown and (name != "hires" or has_hires)) for name in GROUPS]


def page_values(raw: dict[str, Any]) -> dict[str, Any]:
    """The page's request with only the values its mode reads: a picture left in a hidden box, a
    side left at 50 px, a hires fix ticked before switching modes are not sent (they would be refused)."""
    mode = raw.get("mode") or "text"
    shown = _SHOWN.get(mode, set())
    out = dict(raw)
    if "image" not in shown and "editor" not in shown:
        out["image"] = None
    if "editor" not in shown:
        out["mask"] = None
    elif isinstance(raw.get("mask"), dict):  # the editor holds the picture (background) and the mask (its layer)
        out["image"] = raw["mask"]
    if "outpaint" not in shown:
        out.update({f"outpaint_{side}": 0 for side in ("left", "top", "right", "bottom")})
    if "hires" not in shown:
        out["hires_fix"] = False
    return out

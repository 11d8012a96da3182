"""The page's picture controls: the mode, the input image, the mask, strength, outpainting, hires fix.

Built from the profile: a mode the model lacks (``ModelProfile.modes``) is not offered. The input
image takes a file, a drag-and-drop and a paste from the clipboard (``gr.Image``'s upload and
clipboard sources); the mask is painted on the picture (``gr.ImageEditor``, its brush layer is the
mask) on the page, while the API's ``mask`` is a plain uploaded image. Each control shows only in
the modes that read it, so a person never sets a value the request would refuse.

**The mode's controls show by the page's CSS, not by Gradio's visibility** (``MODE_CSS``: the mode
change's js marks ``<body data-t2i-mode>``). Gradio 6.31's frontend asks every component under a
container for its value whenever the container gets a value-less update (a visibility, or the
loading status each event's progress message sends to its inputs and outputs: ``update_state``,
``#h``), and the image editor answers by uploading its picture, mask and composite again: with the
editor's group an output of the mode change and the editor an input of Generate, one inpaint posted
39 to 133 uploads, and the app's own rate limit refused half of them (issue 48). So no event with a
handler has the editor, or a container around it, among its inputs or outputs: the mode change is
the browser's alone, and Generate takes the editor's value once, in a js step of its own
(``hold_mask``), before the handler's event.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from ...fields import NONE
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
from .control_panel import PAD_JS

MODE_LABELS = {"text": "Text to image", "image": "Image to image", "inpaint": "Inpaint", "outpaint": "Outpaint"}
# which controls each mode reads (the rest are hidden)
_SHOWN = {
    "text": {"hires", "control"},
    "image": {"image", "strength", "slider", "control"},
    "inpaint": {"editor", "strength", "mask_blur", "slider", "control"},
    "outpaint": {"image", "strength", "mask_blur", "outpaint", "slider"},
}
# each group's element ("slider": the result's before/after, made beside the gallery)
GROUP_IDS = {"image": "image-group", "editor": "editor-group", "strength": "strength", "mask_blur": "mask-blur",
             "outpaint": "outpaint-row", "hires": "hires", "slider": "before-after",
             "control": "control-panel"}  # fmt: skip


def _mode_css() -> str:
    """Each group hidden unless ``<body data-t2i-mode>`` names a mode that reads it (no mark: text to image).
    The slider shows in any mode while it holds a hires fix's first pass (``<body data-t2i-first-pass>``,
    ``send_to._SLIDER_JS``)."""
    rules = []
    for name, elem_id in GROUP_IDS.items():
        modes = [mode for mode, shown in _SHOWN.items() if name in shown]
        shown_in = "".join(f':not([data-t2i-mode="{mode}"])' for mode in modes)
        if name == "slider":
            shown_in += ":not([data-t2i-first-pass])"
        body = "body[data-t2i-mode]" if "text" in modes else "body"
        rules.append(f"{body}{shown_in} #{elem_id} {{ display: none !important; }}")
    return "\n".join(rules) + "\n"


MODE_CSS = _mode_css()

# The mode change, in the browser alone: the mark the CSS reads, and the heading's text.
MODE_JS = (
    "(mode) => {\n  const names = "
    + json.dumps(MODE_LABELS)
    + ";\n  document.body.dataset.t2iMode = names[mode] ? mode : 'text';\n"
    "  return '## ' + (names[mode] || names.text);\n}"
)

# Generate's first step (no handler, so no progress message ever reaches the editors): the mask editor's
# value, which Gradio uploads as it gathers it, in inpaint mode (nothing otherwise), and the control pad's
# (``control_panel.PAD_JS``). The handler's event reads them. A mask file uploaded just before Generate
# whose change event has not yet put it in the editor (a slow upload) is the editor's one layer here
# too, as that event makes it (``send_to._MASK_JS``).
MASK_JS = """
(mode, editor, file) => {
  if (mode !== 'inpaint') { return null; }
  const layers = (editor && editor.layers) || [];
  if (!file || layers.length) { return editor; }
  const background = (editor && editor.background) || null;
  const composite = (editor && editor.composite) || background;
  return { background: background, layers: [file], composite: composite, id: null };
}
"""
HOLD_JS = f"(mode, editor, file, control, pad) => [({MASK_JS})(mode, editor, file), ({PAD_JS})(control, pad)]"


def brush_radius(p: ModelProfile) -> int:
    """The mask brush's radius in the picture's pixels: a sixteenth of the model's default side (4 px on
    the embedded model's 64 px pictures, 64 on SDXL's 1024; a fixed 24 covered most of a 64 px one)."""
    return max(2, min(p.default_width, p.default_height) // 16)


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
    with gr.Group(elem_id=GROUP_IDS["image"]):
        c["image"] = gr.Image(
            label="Input image (drop, upload or paste)",
            type="filepath",
            sources=["upload", "clipboard"],
            format="png",
            elem_id="input-image",
            height=280,
        )
    with gr.Group(elem_id=GROUP_IDS["editor"]):
        c["mask"] = gr.ImageEditor(
            label="Paint where the picture changes",
            type="filepath",
            sources=["upload", "clipboard"],
            brush=gr.Brush(colors=["#ffffff"], color_mode="fixed", default_size=brush_radius(p)),
            eraser=gr.Eraser(default_size=brush_radius(p)),
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
                              elem_id=GROUP_IDS["strength"])  # fmt: skip
    c["mask_blur"] = gr.Slider(0, MAX_MASK_BLUR, value=DEFAULT_MASK_BLUR, step=1, label="Mask blur (px)",
                               elem_id=GROUP_IDS["mask_blur"])  # fmt: skip
    step, most = lim.size_multiple, max(lim.size_multiple, lim.max_size // 2)
    with gr.Row(elem_id=GROUP_IDS["outpaint"]):
        for side in ("left", "top", "right", "bottom"):
            c[f"outpaint_{side}"] = gr.Slider(0, most, value=0, step=step, label=f"Extend {side} (px)",
                                              elem_id=f"outpaint-{side}", min_width=80)  # fmt: skip
    with gr.Accordion("Hires fix", open=False, visible="image" in p.modes, elem_id=GROUP_IDS["hires"]):
        c["hires_fix"] = gr.Checkbox(False, label="Upscale and redraw at the larger size", elem_id="hires-fix")
        c["hires_scale"] = gr.Radio(list(HIRES_SCALES), value=2.0, label="Upscale by", elem_id="hires-scale")
        c["hires_strength"] = gr.Slider(0.05, 1.0, value=DEFAULT_HIRES_STRENGTH, step=0.05,
                                        label="Hires denoising strength", elem_id="hires-strength")  # fmt: skip
        c["hires_steps"] = gr.Slider(0, lim.max_steps, value=0, step=1, label="Hires steps (0: the same)",
                                     elem_id="hires-steps")  # fmt: skip
    return c


def wire_modes(picture: dict[str, Any], heading: gr.Markdown) -> None:
    """The mode's controls and heading follow the mode, in the browser (``MODE_CSS``, ``MODE_JS``)."""
    picture["mode"].change(fn=None, inputs=[picture["mode"]], outputs=[heading], js=MODE_JS, api_visibility="private")


def hold_mask(
    triggers: list[Any], picture: dict[str, Any], panel: dict[str, Any]
) -> tuple[Any, gr.ImageEditor, gr.ImageEditor]:
    """Generate's first step (``HOLD_JS``) and the hidden inputs that hold the mask editor's and the control
    pad's values for the handler's event (never drawn: Gradio asks them for nothing); the handler's event
    goes ``.then``."""
    held = gr.ImageEditor(type="filepath", visible=False, layers=False, elem_id="held-mask")
    held_map = gr.ImageEditor(type="filepath", visible=False, layers=False, elem_id="held-control")
    inputs = [picture["mode"], picture["mask"], picture["_mask_file"], panel["control"], panel["control_image"]]
    step = gr.on(triggers=triggers, fn=None, inputs=inputs, outputs=[held, held_map], js=HOLD_JS,
                 api_visibility="private", show_progress="hidden")  # fmt: skip
    return step, held, held_map


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
    if "control" not in shown or raw.get("control") in (None, "", NONE):  # the pad is read with a control only
        out.update(control=NONE, control_image=None)
    return out

"""The page's ControlNet panel (issue 51): pick a control, upload or draw its map, see the map the model
reads before generating, its weight and window.

The map is drawn on a sketch pad (``gr.ImageEditor``) that starts black at the model's default size,
with a white brush (and a black one to take strokes back): what the pad shows is the map, white where
things go, on black (the way the embedded model's ControlNet was trained, and a scribble or a
segmentation map works). An uploaded picture, or a result sent with "Send to control" (``send_to``),
becomes the pad's picture, to draw over; ``control_preprocess`` makes a picture a map (``canny``: its
edges; ``invert``: a dark drawing on white, AUTOMATIC1111's canvas). The request's ``control_image`` is
the pad's composite: its picture and strokes (``handler.with_upload_bytes``).

Like the mask editor (``mode_panel``'s docstring), the pad is no input or output of an event with a
handler: Generate's first step (``mode_panel.hold_mask``) and "Show the map" hold its value
(``PAD_JS``) in a hidden input the handlers read. A pad never shown (its starting black is a file of
the server's, not an upload of the caller's) is held as nothing, and so is any pad while no control is
picked; a shown pad is the map it shows, all black included. The panel shows in the modes a
ControlNet acts in (``fields.CONTROL_MODES``; not outpainting: ``mode_panel.MODE_CSS``). A pasted
parameters text restores the unit's settings, not its map (the text has none): the panel says so.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr
from PIL import Image

from ... import fields
from ...controls import SCALE_MAX
from ...protocol import ModelProfile

PAD_ID = "control-pad"  # PAD_JS finds the pad's starting value by it
PREPROCESS_LABELS = {"none": "none (the picture is the map)", "canny": "canny (a picture's edges)",
                     "invert": "invert (a dark drawing on white)"}  # fmt: skip

# The pad's value as a request's map, or null: no control picked, or a pad never shown (its panel never
# opened: its black is still the server's file, no upload of the caller's, so it goes nowhere and the
# request is told it needs a map). A pad once shown is uploaded as it shows, black included, at each
# gathering (the composite is the map); should its background still name the server's file, it is left out.
PAD_JS = """
(control, pad) => {
  if (!pad || !control || control === 'none') { return null; }
  const components = (window.gradio_config && window.gradio_config.components) || [];
  const mine = components.find((c) => c.props && c.props.elem_id === 'control-pad');
  const start = mine && mine.props.value && mine.props.value.background;
  const untouched = (file) => !file || (start && file.path === start.path);
  const layers = (pad.layers || []).filter(Boolean);
  if (!layers.length && untouched(pad.background)) { return null; }
  const background = untouched(pad.background) ? null : pad.background;
  return { background: background, layers: layers, composite: pad.composite || background, id: null };
}
"""


def pad_radius(p: ModelProfile) -> int:
    """The pad's brush radius: a sixth of the model's default side (a disc like the ones the embedded
    model's ControlNet was judged on, 11 px on its 64 px pictures; 170 on SDXL's 1024)."""
    return max(3, round(min(p.default_width, p.default_height) / 6))


def control_controls(p: ModelProfile) -> dict[str, Any]:
    """The panel's controls, by the API's parameter names (``control_image``: the pad), and the preview's
    button and picture (``_show``, ``_preview``). Hidden where the server loaded no ControlNet."""
    c: dict[str, Any] = {}
    default = {name: fields.BY_NAME[name].default for name in ("control_scale", "control_start", "control_end")}
    with gr.Accordion("ControlNet: say where things go", open=False, visible=any(m.controls for m in p.served),
                      elem_id="control-panel"):  # fmt: skip
        c["control"] = gr.Dropdown(
            [fields.NONE, *p.controls],
            value=fields.NONE,
            label="Control",
            info="Draw or upload a map: white where things go, on black",
            elem_id="control",
        )
        black = Image.new("RGB", (p.default_width, p.default_height))
        c["control_image"] = gr.ImageEditor(
            value={"background": black, "layers": [], "composite": None},
            label="Map: draw or upload",
            type="filepath",
            sources=["upload", "clipboard"],
            brush=gr.Brush(
                colors=["#ffffff", "#000000"],
                default_color="#ffffff",
                color_mode="defaults",
                default_size=pad_radius(p),
            ),
            eraser=gr.Eraser(default_size=pad_radius(p)),
            layers=False,
            transforms=(),
            format="png",
            elem_id=PAD_ID,
            height=280,
        )
        c["control_preprocess"] = gr.Radio([(PREPROCESS_LABELS[name], name) for name in fields.CONTROL_PREPROCESSORS],
                                           value="none", label="Preprocess", elem_id="control-preprocess")  # fmt: skip
        with gr.Row():
            c["_show"] = gr.Button("Show the map the model reads", size="sm", elem_id="control-show", scale=0,
                                   min_width=120)  # fmt: skip
            c["_preview"] = gr.Image(label="The map, at the picture's size", type="pil", format="png",
                                     interactive=False, elem_id="control-preview", height=160)  # fmt: skip
        c["control_scale"] = gr.Slider(0, SCALE_MAX, value=default["control_scale"], step=0.05, label="Weight",
                                       elem_id="control-scale")  # fmt: skip
        with gr.Row():
            for name, words in (("control_start", "Starts at"), ("control_end", "Ends at")):
                c[name] = gr.Slider(0, 1, value=default[name], step=0.05, label=words, min_width=120,
                                    info="the fraction of the steps", elem_id=name.replace("_", "-"))  # fmt: skip
        gr.Markdown("A pasted parameters text or a history entry restores the control's settings, not its map "
                    "(the text has none): draw or upload the map again.", elem_id="control-note")  # fmt: skip
    return c


def wire_preview(panel: dict[str, Any], size: tuple[gr.Slider, gr.Slider], preview: Callable[..., Any]) -> None:
    """ "Show the map": the pad's value held (``PAD_JS``, whichever control is picked) in a hidden input of
    its own, then ``preview`` (``handler.make_preview``) draws the map at the picture's size (``size``:
    the width and height sliders)."""
    held = gr.ImageEditor(type="filepath", visible=False, layers=False, elem_id="held-map")
    hold = panel["_show"].click(fn=None, inputs=[panel["control_image"]], outputs=[held],
                                js=f"(pad) => ({PAD_JS})('shown', pad)", api_visibility="private",
                                show_progress="hidden")  # fmt: skip
    hold.then(fn=preview, inputs=[held, panel["control_preprocess"], *size], outputs=[panel["_preview"]],
              api_visibility="private", concurrency_id="control-map", concurrency_limit=2, preprocess=False,
              show_progress="hidden")  # fmt: skip

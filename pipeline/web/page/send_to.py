""" "Send to image-to-image" and "Send to inpaint" on the results and the history, and the result's
before/after slider (``gr.ImageSlider``), as AUTOMATIC1111 has them.

Both run in the browser alone (``js=`` events, no handler, nothing on the API). Send-to fetches the
chosen picture (the selected one, else the first) as the browser already shows it, uploads it
through the app's own upload route (``upload_route``: the caller's own upload, with its rate and
share, as if the person had dropped the file), and puts it in the mode's input: the input image
for image-to-image, the mask editor's picture for inpainting; then picks the mode, whose change
shows its controls. The value names the caller's own upload, so the front door takes it on
Generate like any other. The slider shows the input picture against the first result after an
image-mode generation, and a hires fix's first pass against its result.
"""

from __future__ import annotations

from typing import Any, Sequence

import gradio as gr

# The picture a gallery's chosen item shows (the selected one, else the first), uploaded as the caller's
# own; ``{gallery}`` filled in per button. The file value, or null (nothing to send, or refused: said).
_UPLOAD_JS = """
async (items, gallery) => {
  const list = Array.isArray(items) ? items : [];
  if (!list.length) { return null; }
  const thumbs = [...document.querySelectorAll('#' + gallery + ' .thumbnail-item')];
  const at = Math.max(0, thumbs.findIndex((t) => t.classList.contains('selected')));
  const chosen = list[Math.min(at, list.length - 1)];
  const picture = chosen && (chosen.image || chosen);
  if (!picture || !picture.url) { return null; }
  const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\\/$/, '');
  const route = (path) => (root ? root + '/' + path : new URL(path, document.baseURI).href);
  try {
    const blob = await (await fetch(picture.url)).blob();
    const form = new FormData();
    form.append('files', blob, 'sent.png');
    const answer = await fetch(route('gradio_api/upload'), { method: 'POST', body: form });
    if (!answer.ok) {
      const why = await answer.json().catch(() => ({}));
      window.alert(why.detail || ('The upload was refused (' + answer.status + ')'));
      return null;
    }
    const [path] = await answer.json();
    return { path: path, url: route('gradio_api/file=' + path), orig_name: 'sent.png', size: blob.size,
             mime_type: 'image/png', is_stream: false, meta: { _type: 'gradio.FileData' } };
  } catch (error) {
    window.alert('Could not send the picture: ' + error);
    return null;
  }
}
"""

# Send to a mode: the new input value and the mode (or, on failure, what was there).
_SEND_JS = """
async (items, image, editor, mode) => {
  const file = await (%(upload)s)(items, '%(gallery)s');
  if (!file) { return [image, editor, mode]; }
  if ('%(mode)s' === 'inpaint') {
    return [image, { background: file, layers: [], composite: file, id: null }, 'inpaint'];
  }
  return [file, editor, 'image'];
}
"""

# Send to control: the picture becomes the control pad's (``control_panel``), the first control is
# picked if none was, and a picture is read for its edges unless another preprocessor was chosen; the
# panel opens.
_SEND_CONTROL_JS = """
async (items, pad, control, preprocess) => {
  const file = await (%(upload)s)(items, '%(gallery)s');
  if (!file) { return [pad, control, preprocess]; }
  const label = document.querySelector('#control-panel > button.label-wrap');
  if (label && !label.classList.contains('open')) { label.click(); }
  return [{ background: file, layers: [], composite: file, id: null },
          control === 'none' ? '%(first)s' : control, preprocess === 'none' ? 'canny' : preprocess];
}
"""

# The page's generate event's own js (``remember_before_js``): it passes the inputs on as they are and
# keeps the request's "before" picture (the mask editor's picture in inpaint mode, else the input
# image, as Generate's first step already uploaded them) and, for outpainting, the sides it grows.
# The slider reads it after the request, with no picture input of its own (an input of an event is
# asked for its value at every progress message: ``mode_panel``'s docstring).
_BEFORE_JS = """
(...values) => {
  const mode = values[%(mode)d], editor = values[%(mask)d];
  window.__t2iBefore = {
    mode: mode,
    picture: mode === 'inpaint' ? (editor && editor.background) : values[%(image)d],
    sides: [values[%(outpaint_left)d], values[%(outpaint_top)d],
            values[%(outpaint_right)d], values[%(outpaint_bottom)d]],
  };
  return values;
}
"""

# After a request in an image mode: its input picture against the first result, at the result's size.
# An outpainted result is larger than its input: the input is drawn where it sits on the grown canvas
# (the new border left grey), so the two line up. After a hires fix: its first pass (the record's
# ``first_pass``, as the file route names it) against the result; the slider then shows in text mode
# too (``<body data-t2i-first-pass>``, ``mode_panel.MODE_CSS``). A request that ended in an error
# (the status line) leaves the slider as it was, like the results.
_SLIDER_JS = """
async (items, record) => {
  const line = document.querySelector('#status .t2i-status span');
  if (line && line.textContent.startsWith('Error')) { return [undefined]; }
  const list = Array.isArray(items) ? items : [];
  const first = list.length ? (list[0].image || list[0]) : null;
  const kept = window.__t2iBefore || {};
  const passes = (record && Array.isArray(record.first_pass)) ? record.first_pass : [];
  if (first && passes.length) {
    const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\\/$/, '');
    const path = 'gradio_api/file=' + encodeURI(passes[0]);
    const url = root ? root + '/' + path : new URL(path, document.baseURI).href;
    const before = { url: url, path: null, orig_name: 'first-pass.png', mime_type: 'image/png',
                     meta: { _type: 'gradio.FileData' } };
    document.body.dataset.t2iFirstPass = '1';
    return [[before, first]];
  }
  delete document.body.dataset.t2iFirstPass;
  if (!first || !kept.picture || !kept.mode || kept.mode === 'text') { return [null]; }
  if (kept.mode !== 'outpaint') { return [[kept.picture, first]]; }
  const load = (url) => new Promise((done, fail) => {
    const img = new Image();
    img.onload = () => done(img);
    img.onerror = fail;
    img.src = url;
  });
  try {
    const [input, result] = await Promise.all([load(kept.picture.url), load(first.url)]);
    const [left, top, right, bottom] = kept.sides.map((side) => Number(side) || 0);
    const scale = result.naturalWidth / (input.naturalWidth + left + right);
    const canvas = document.createElement('canvas');
    canvas.width = result.naturalWidth;
    canvas.height = result.naturalHeight;
    const pen = canvas.getContext('2d');
    pen.fillStyle = '#808080';
    pen.fillRect(0, 0, canvas.width, canvas.height);
    pen.drawImage(input, left * scale, top * scale, input.naturalWidth * scale, input.naturalHeight * scale);
    const url = canvas.toDataURL('image/png');
    const before = { url: url, path: null, orig_name: 'before.png', mime_type: 'image/png',
                     meta: { _type: 'gradio.FileData' } };
    return [[before, first]];
  } catch (error) {
    return [[kept.picture, first]];
  }
}
"""


def remember_before_js(fields: Sequence[str]) -> str:
    """The js of the page's generate event, for its inputs in ``fields``' order (``_BEFORE_JS``)."""
    names = ("mode", "mask", "image", "outpaint_left", "outpaint_top", "outpaint_right", "outpaint_bottom")
    return _BEFORE_JS % {name: fields.index(name) for name in names}


# An uploaded mask becomes the editor's one layer, over its picture (``uploads.read_mask``: an opaque
# layer redraws where it is light); cleared, the editor keeps what it holds.
_MASK_JS = """
(file, editor) => {
  if (!file) { return editor; }
  const background = editor && editor.background;
  const composite = (editor && editor.composite) || background || null;
  return { background: background || null, layers: [file], composite: composite, id: null };
}
"""


def wire_mask_upload(picture: dict[str, Any]) -> None:
    picture["_mask_file"].change(fn=None, inputs=[picture["_mask_file"], picture["mask"]], outputs=[picture["mask"]],
                                 api_visibility="private", js=_MASK_JS)  # fmt: skip


def before_after() -> gr.ImageSlider:
    """The slider under the results, shown in the image modes (``mode_panel.MODE_CSS``)."""
    return gr.ImageSlider(label="Before / after", type="filepath", interactive=False,
                          elem_id="before-after", max_height=360)  # fmt: skip


def send_buttons(elem_id: str, modes: tuple[str, ...], controls: tuple[str, ...] = ()) -> dict[str, gr.Button]:
    """The buttons under the gallery ``elem_id``: one per mode the model serves, and "Send to control"
    where the server loaded a ControlNet (made where they show)."""
    buttons = {}
    targets = [(mode, words) for mode, words in (("image", "Send to image-to-image"), ("inpaint", "Send to inpaint"))
               if mode in modes] + ([("control", "Send to control")] if controls else [])  # fmt: skip
    with gr.Row(elem_id=f"send-{elem_id}", visible=bool(targets)):
        for target, words in targets:
            buttons[target] = gr.Button(words, size="sm", elem_id=f"send-{elem_id}-{target}", min_width=80)
    return buttons


def wire_send_to(gallery: gr.Gallery, elem_id: str, buttons: dict[str, gr.Button], picture: dict[str, Any],
                 panel: dict[str, Any], controls: tuple[str, ...] = ()) -> None:  # fmt: skip
    targets = [picture["image"], picture["mask"], picture["mode"]]
    for mode, button in buttons.items():
        if mode == "control":
            pad = [panel["control_image"], panel["control"], panel["control_preprocess"]]
            js = _SEND_CONTROL_JS % {"upload": _UPLOAD_JS, "gallery": elem_id, "first": controls[0]}
            button.click(fn=None, inputs=[gallery, *pad], outputs=pad, api_visibility="private", js=js)
            continue
        button.click(fn=None, inputs=[gallery, *targets], outputs=targets, api_visibility="private",
                     js=_SEND_JS % {"upload": _UPLOAD_JS, "mode": mode, "gallery": elem_id})  # fmt: skip


def wire_slider(slider: gr.ImageSlider, generated: Any, gallery: gr.Gallery, info: gr.JSON) -> None:
    """The slider after each of the page's requests (``generated``: its generate event), once: not at
    each gallery change, and with no picture input of its own (``_BEFORE_JS``); ``info``: the record."""
    generated.success(fn=None, inputs=[gallery, info], outputs=[slider], api_visibility="private", js=_SLIDER_JS,
                      show_progress="hidden")  # fmt: skip

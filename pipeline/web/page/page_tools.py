"""The page's helpers around generate: size presets and swap, the tab's history, pasted parameters, keys.

Every event here is the page's own (private, on the ``ui`` concurrency group, no progress
overlay); the logic is in pure modules (``presets``, ``results``, ``a1111``), this module only
wires it to the components.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

from ...request import Limits
from ..apis.a1111 import fill_from, match_sampler, notes_html, parse_parameters
from .presets import SizePreset, parse_value, preset_value
from .results import history_items, restore, summary_markdown
from .site import Site

# The page's small events share a few worker threads: each is bounded and quick (inputs.py caps
# what it may be sent; the parsers are linear), and no client can hold more than these.
UI_CONCURRENCY = 4
UI: dict[str, Any] = dict(
    api_visibility="private", concurrency_id="ui", concurrency_limit=UI_CONCURRENCY, show_progress="hidden"
)

# Escape stops the running job: it clicks Stop while the page's request is in flight (the status
# line marks it ``data-running``: ``shown.status_html``), unless the key is meant for a gallery's own
# preview (Escape closes it). Installed once, on load.
KEYS_JS = """() => {
  if (window.__t2iKeys) return;
  window.__t2iKeys = true;
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.defaultPrevented) return;
    if (event.target instanceof Element && event.target.closest("#gallery, #history")) return;
    const running = document.querySelector("#status .t2i-status[data-running]");
    const stop = document.querySelector("#stop");
    if (running && stop) { stop.click(); event.preventDefault(); }
  });
}"""


# Buttons that cannot act are disabled until they can (issue 48): Stop while nothing of this tab's runs
# (the status line's ``data-running``, the same mark Escape reads), "Reuse this image's seed" and
# "Send to ..." while their gallery holds no picture. The page's own state decides, in the browser,
# at every change of the page: Gradio's own ``interactive`` updates would need an event at every
# end of a request, and a request refused at the join ends with none.
READY_JS = """() => {
  if (window.__t2iReady) return;
  window.__t2iReady = true;
  const rules = [
    ["#stop", () => document.querySelector("#status .t2i-status[data-running]")],
    ["#reuse-seed, [id^=send-gallery-]", () => document.querySelector("#gallery img")],
    ["[id^=send-history-]", () => document.querySelector("#history img")],
  ];
  let queued = false;
  const apply = () => {
    queued = false;
    for (const [buttons, ready] of rules) {
      const off = !ready();
      for (const button of document.querySelectorAll(buttons)) {
        if (button.tagName === "BUTTON" && button.disabled !== off) { button.disabled = off; }
      }
    }
  };
  new MutationObserver(() => { if (!queued) { queued = true; requestAnimationFrame(apply); } })
    .observe(document.body, { childList: true, subtree: true });
  apply();
}"""


@dataclass
class Controls:
    """The controls a set of parameters fills, under the API's names (``scheduler``: the sampler, if any)."""

    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    seed: gr.Number
    randomize_seed: gr.Checkbox
    width: gr.Slider
    height: gr.Slider
    num_inference_steps: gr.Slider
    guidance_scale: gr.Slider
    scheduler: gr.Dropdown | None = None
    lora: gr.Dropdown | None = None
    lora_scale: gr.Slider | None = None
    step_cache: gr.Dropdown | None = None
    model: gr.Dropdown | None = None
    mode: gr.Radio | None = None
    strength: gr.Slider | None = None
    mask_blur: gr.Slider | None = None
    hires_fix: gr.Checkbox | None = None
    hires_scale: gr.Radio | None = None
    hires_strength: gr.Slider | None = None
    hires_steps: gr.Slider | None = None
    control: gr.Dropdown | None = None
    control_scale: gr.Slider | None = None
    control_start: gr.Slider | None = None
    control_end: gr.Slider | None = None
    control_preprocess: gr.Radio | None = None

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def components(self) -> list[Any]:
        return [getattr(self, name) for name in self.names()]

    def samplers(self) -> dict[str, Any] | None:
        """The sampler choices as {label: value}; None when the page has no sampler control."""
        if self.scheduler is None:
            return None
        pairs = [c if isinstance(c, (tuple, list)) else (c, c) for c in self.scheduler.choices or []]
        return {str(label): value for label, value in pairs}

    def updates(self, values: dict[str, Any]) -> list[Any]:
        """One output per control: its new value, or ``gr.skip()`` to leave it as it is."""
        return [values[name] if name in values else gr.skip() for name in self.names()]


def swapped(width: Any, height: Any) -> tuple[Any, Any]:
    """Swap: the width becomes the height and the height the width."""
    return height, width


def wire_sizes(
    presets: list[SizePreset], preset: gr.Radio, swap: gr.Button, width: gr.Slider, height: gr.Slider
) -> None:
    """A preset sets both sliders; Swap exchanges them; any size change shows its preset (or none)."""

    def choose(value: Any) -> tuple[Any, Any]:
        size = parse_value(value)
        return size if size else (gr.skip(), gr.skip())

    def shown(w: Any, h: Any) -> str | None:
        return preset_value(presets, w, h)

    preset.input(fn=choose, inputs=[preset], outputs=[width, height], **UI)
    swap.click(fn=swapped, inputs=[width, height], outputs=[width, height], **UI)
    for side in (width, height):
        side.change(fn=shown, inputs=[width, height], outputs=[preset], **UI)


def _matching_sampler(controls: Controls, name: Any) -> dict[str, Any]:
    """``{"scheduler": value}`` for the sampler choice that is ``name`` (a label or a value); {} if none is."""
    choices = controls.samplers()
    if not choices or not isinstance(name, str):
        return {}
    values = {str(value): value for value in choices.values()}
    if name in values:
        return {"scheduler": values[name]}
    label = match_sampler(name, list(choices))
    return {"scheduler": choices[label]} if label is not None else {}


def wire_history(
    finished: Any,
    site: Site,
    summary: gr.Markdown,
    history: tuple[gr.Accordion, gr.Gallery],
    download: gr.Button,
    archive: gr.File,
    controls: Controls,
) -> None:
    """After each finished generation: the summary and the history; selecting a past image restores it.

    Every one of these reads the session's results from the server's record (``site.results``,
    filed by the generate handler); none takes a path, a gallery or a record from the client.
    """

    panel, history_gallery = history

    def remember(request: gr.Request) -> tuple[Any, Any, Any]:
        session = request.session_hash
        kept, last = site.results.history(session), site.results.last(session)
        # the panel opens with the tab's first result (folded until then); a person may fold it again
        first = len(kept) == len((last or {}).get("seeds") or [None])
        opened = gr.Accordion(open=True) if first else gr.skip()
        return opened, history_items(kept), summary_markdown(last) or gr.skip()

    def restore_selected(event: gr.SelectData, request: gr.Request) -> list[Any]:
        params = restore(site.results.history(request.session_hash), event.index)
        if params is None:
            return controls.updates({})
        sampler = _matching_sampler(controls, params.pop("scheduler", None))
        return controls.updates({**params, **sampler, "randomize_seed": False})

    def zipped(request: gr.Request) -> Any:
        from .handler import request_caller

        caller = request_caller(request, site.trusted)
        owner = caller.key if caller is not None else None
        path = site.results.zip(request.session_hash, site.output_dir, owner)
        if path is None:
            gr.Warning("No image to download yet (or they have been cleaned up): generate one first.")
            return gr.skip()
        return gr.update(value=str(path), visible=True)

    finished.success(fn=remember, inputs=None, outputs=[panel, history_gallery, summary], **UI)
    history_gallery.select(fn=restore_selected, inputs=None, outputs=controls.components(), **UI)
    download.click(
        fn=zipped,
        inputs=None,
        outputs=[archive],
        api_visibility="private",
        concurrency_id="zip",
        concurrency_limit=2,
    )


def reuse_seed(site: Site) -> Any:
    """Reuse: the seed of the selected image of the tab's last result (the first if none was
    selected) into the seed box, randomize off. The seeds are the server's record, not the page's."""

    def reuse(selected: Any, request: gr.Request) -> tuple[Any, Any]:
        record = site.results.last(request.session_hash)
        seeds = record.get("seeds") if record else None
        if not seeds:
            raise gr.Error("Generate an image first, then pick it in the gallery.", title="No image yet")
        index = selected if isinstance(selected, int) and 0 <= selected < len(seeds) else 0
        return seeds[index], False

    return reuse


def wire_paste(
    button: gr.Button,
    text: gr.Textbox,
    notes: gr.HTML,
    controls: Controls,
    limits: Limits,
    model: str,
    lora_hashes: dict[str, str] | None = None,
) -> None:
    """Apply a pasted AUTOMATIC1111 parameters text to the controls; say what was not applied, and why."""

    def apply(pasted: Any) -> list[Any]:
        choices = controls.samplers()
        fill = fill_from(
            parse_parameters(pasted if isinstance(pasted, str) else ""),
            limits,
            samplers=list(choices) if choices is not None else None,
            model=model,
            lora_hashes=lora_hashes,
        )
        values = dict(fill.values)
        if "scheduler" in values and choices is not None:
            values["scheduler"] = choices[values["scheduler"]]
        return [*controls.updates(values), notes_html(fill)]

    button.click(fn=apply, inputs=[text], outputs=[*controls.components(), notes], **UI)


def wire_keys(demo: gr.Blocks) -> None:
    """Escape stops the running job (Enter in the prompt already generates: the prompt's submit); buttons
    that cannot act are disabled until they can (``READY_JS``)."""
    demo.load(fn=None, js=KEYS_JS, api_visibility="private")
    demo.load(fn=None, js=READY_JS, api_visibility="private")

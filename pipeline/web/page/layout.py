"""The Blocks page: controls, gallery and info, the page's and the API's events, Stop."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from ... import fields
from ...config import Settings
from ...default_model import EXAMPLE_PROMPTS, GENERIC_PROMPTS
from ...loras import NONE, SCALE_MAX, SCALE_MIN
from ...protocol import ModelProfile
from ...request import FIELDS, IMAGE_FIELDS, MAX_SEED, Limits
from ...serving.base import Adapter
from ...serving.postprocess import sampler_name
from ..apis.mcp_tool import serve_images
from ..door.identity import TrustedProxies
from .control_panel import control_controls, wire_preview
from .handler import PageJobs, make_generate, make_preview, make_validator, selected_index
from .mode_panel import hold_mask, mode_controls, wire_modes
from .model_picker import every_preset, model_picker, wire_model_picker
from .page_tools import UI_CONCURRENCY, Controls, reuse_seed, wire_history, wire_keys, wire_paste, wire_sizes
from .presets import preset_value, size_presets
from .results import HISTORY_SIZE, MODE_NAMES
from .send_to import before_after, remember_before_js, send_buttons, wire_mask_upload, wire_send_to, wire_slider
from .shown import REFUSED_JS, status_html
from .site import Site, attach

log = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 60.0  # how long Stop waits for the session's job to end before saying "stopped" anyway


PASTED_MODE_CONTROLS = ("mode", "strength", "mask_blur", "hires_fix", "hires_scale", "hires_strength", "hires_steps")
# the ControlNet unit's settings (its map is not in a text: ``control_panel``)
PASTED_CONTROL_FIELDS = ("control", "control_scale", "control_start", "control_end", "control_preprocess")
# The controls a pasted parameters text, a history entry or a reused seed fills (``page_tools.Controls``).
PASTED_CONTROLS = ("prompt", "negative_prompt", "seed", "randomize_seed", "width", "height", "num_inference_steps",
                   "guidance_scale", "scheduler", "lora", "lora_scale", "step_cache", "model",
                   *PASTED_MODE_CONTROLS, *PASTED_CONTROL_FIELDS)  # fmt: skip


def device_words(device: str) -> str:
    """The footer's name for what draws: "the CPU", "the GPU" (CUDA), "the Apple GPU" (MPS)."""
    kind = device.split(":", 1)[0].lower()
    return {"cpu": "the CPU", "cuda": "the GPU", "mps": "the Apple GPU"}.get(kind, f"the {device}")


def build_demo(adapter: Adapter, settings: Settings) -> gr.Blocks:
    p, lim = adapter.profile, adapter.limits
    presets = size_presets(p.default_width, p.default_height, lim)
    with gr.Blocks(title="Text to image") as demo:
        site = attach(demo, Site(settings.output_dir, TrustedProxies.from_settings(settings)))
        # one line: on a phone the result must be in view under the prompt; it follows the mode
        heading = gr.Markdown(f"## {MODE_NAMES['text']}", elem_id="heading")
        # Like the best-liked Spaces: the prompt and its buttons in one row, the result large under
        # it, the settings folded away. On a phone the columns stack, result first.
        with gr.Row(equal_height=True, elem_id="prompt-row"):
            prompt = gr.Textbox(
                label="Prompt",
                # a hint, not a value: an example in a placeholder read as a prompt already typed
                placeholder="Describe the picture, e.g. "
                + (EXAMPLE_PROMPTS[0] if settings.model is None else GENERIC_PROMPTS[0]),
                lines=1,  # one line, so Enter submits (Gradio inserts a newline when lines > 1)
                max_lines=4,
                max_length=lim.max_prompt_chars,
                elem_id="prompt",
                scale=6,
                min_width=160,  # with the buttons, one row on a 390 px phone
            )
            with gr.Column(scale=0, min_width=100):
                generate_button = gr.Button("Generate", variant="primary", elem_id="generate")
                stop_button = gr.Button("Stop", variant="stop", size="sm", elem_id="stop")
        status = gr.HTML(status_html("ready"), elem_id="status")
        with gr.Row():
            with gr.Column(scale=3, min_width=300):
                gallery = gr.Gallery(
                    label="Images",
                    interactive=False,  # an output (a send-to button reads it: an input would make it a drop zone)
                    format="png",
                    columns=2,
                    height=460,  # on a 390x844 phone the whole gallery, thumbnails too, is in view under the prompt
                    object_fit="contain",
                    elem_id="gallery",
                    buttons=["download", "fullscreen"],
                )
                reuse_button = gr.Button("Reuse this image's seed", size="sm", elem_id="reuse-seed")
                send_results = send_buttons("gallery", p.modes, p.controls)
                slider = before_after()
                summary = gr.Markdown("", elem_id="summary")
                with gr.Accordion("Info: the full record (JSON)", open=False, elem_id="info-panel"):
                    info = gr.JSON(label="Info: seed, parameters and timings", elem_id="info")
                selected = gr.State(0)
            with gr.Column(scale=2, min_width=300):
                picker = model_picker(p)  # several models (issue 52); hidden for one
                with gr.Row():
                    size_preset = gr.Radio(
                        [(preset.label, preset.value) for preset in presets],
                        value=preset_value(presets, p.default_width, p.default_height),
                        label="Aspect ratio and size",
                        elem_id="size-preset",
                        scale=4,
                    )
                    swap_button = gr.Button("⇄ Swap", size="sm", elem_id="swap", scale=0, min_width=80)
                picture = mode_controls(p, lim)
                panel = control_controls(p)  # hidden without --controlnet (the embedded model has its own)
                with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
                    adv = _advanced_settings(p, lim)
                with gr.Accordion("Paste parameters", open=False, elem_id="paste"):
                    paste_text, paste_button, paste_notes = _paste_panel(lim)
                # Prompts the embedded model was trained to draw; any other model gets ordinary ones.
                gr.Examples(
                    examples=[[e] for e in (EXAMPLE_PROMPTS if settings.model is None else GENERIC_PROMPTS)],
                    inputs=[prompt],
                    label="Example prompts",
                    elem_id="examples",
                )
        # Folded until it holds something (the first result opens it: page_tools.wire_history).
        with gr.Accordion(
            f"History: this tab's last {HISTORY_SIZE} images", open=False, elem_id="history-panel"
        ) as history_panel:
            history_gallery, download_button, history_zip = _history_panel()
            send_history = send_buttons("history", p.modes, p.controls)
        gr.Markdown(
            f"Model: `{p.name}` on {p.device} ({p.dtype}). Many people can queue; {device_words(p.device)} draws "
            "one job at a time.",
            elem_id="about",
        )
        # The events' inputs: one control a field, in the table's order (``fields.TABLE``); a field the
        # page shows no control for yet is sent at its default from a hidden one (the API still takes it).
        shown = {
            "prompt": prompt,
            **adv,
            **{name: picture[name] for name in IMAGE_FIELDS},  # the mask: its editor
            **{name: block for name, block in panel.items() if name in FIELDS},
            "model": picker,
        }  # control_image: the pad
        inputs = [shown[name] if name in shown else unshown(fields.BY_NAME[name]) for name in FIELDS]
        seed, randomize_seed, width, height, lora, lora_scale, live_preview = (
            adv[n] for n in ("seed", "randomize_seed", "width", "height", "lora", "lora_scale", "live_preview")
        )
        api_mask = gr.Image(label="mask", type="filepath", visible=False, elem_id="api-mask")
        api_control = unshown(fields.BY_NAME["control_image"])
        api_pictures = {FIELDS.index("mask"): api_mask, FIELDS.index("control_image"): api_control}
        api_inputs = [api_pictures.get(i, block) for i, block in enumerate(inputs)]
        generate_event = _wire_generate(
            adapter,
            demo,
            settings,
            site,
            [generate_button.click, prompt.submit],
            (inputs, api_inputs),
            (gallery, info, status),
            stop_button,
            (picture, panel),
        )
        ui: dict[str, Any] = dict(api_visibility="private", concurrency_id="ui", concurrency_limit=UI_CONCURRENCY)
        wire_modes(picture, heading)  # in the browser alone (mode_panel's docstring says why)
        # Through the queue like every page event: the front door serves no /run/predict (queue=False).
        gallery.select(fn=selected_index, inputs=None, outputs=[selected], **ui)
        reuse_button.click(fn=reuse_seed(site), inputs=[selected], outputs=[seed, randomize_seed], **ui)
        # Size presets and swap, the tab's history (restore, zip), pasted parameters, Escape.
        controls = Controls(**{name: shown[name] for name in PASTED_CONTROLS})  # the pad: not a pasted value
        suggested = {info.name: info.scale for info in p.loras}
        lora.input(fn=lambda name: suggested.get(name, gr.skip()), inputs=[lora], outputs=[lora_scale], **ui)
        wire_sizes(every_preset(p, lim), size_preset, swap_button, width, height)
        wire_model_picker(picker, p, lim, adv, size_preset, (picture["mode"], panel["control"]), ui)
        wire_history(generate_event, site, summary, (history_panel, history_gallery), download_button, history_zip,
                     controls)  # fmt: skip
        wire_send_to(gallery, "gallery", send_results, picture, panel, p.controls)
        wire_send_to(history_gallery, "history", send_history, picture, panel, p.controls)
        wire_preview(panel, (width, height), make_preview(adapter, demo, site))
        wire_slider(slider, generate_event, gallery, info)
        wire_mask_upload(picture)
        wire_paste(paste_button, paste_text, paste_notes, controls, lim, p.name, {i.name: i.hash for i in p.loras})
        wire_keys(demo)
        if p.previews:
            demo.load(fn=None, outputs=[live_preview], js="() => true", api_visibility="private")
    if settings.mcp:  # the `generate` MCP tool answers with image content and the info as JSON text
        serve_images(demo)
    # Gradio's own queue is a backstop above everything the app admits (``handler_slots``): with
    # ``max_size`` at ``queue_size``, a burst of admitted requests that arrived before Gradio's loop
    # moved them into the handler was refused there, "Queue is full", under load (tests/server/test_load.py).
    demo.queue(max_size=settings.handler_slots(), api_open=False, default_concurrency_limit=1)
    return demo


def unshown(field: fields.Field) -> Any:
    """A hidden input for a field the page has no control for: the page sends its default, and the API
    lists the field (with that default) for ``gradio_client`` and MCP."""
    label = field.name
    if field.name == "control_image":  # the API's map: a file (gradio_client's handle_file); the page's: its pad
        return gr.Image(label=label, type="filepath", visible=False, elem_id="api-control-image")
    if field.type is bool:
        return gr.Checkbox(value=field.default, visible=False, label=label)
    if field.type is float:
        return gr.Number(value=field.default, visible=False, label=label)
    return gr.Textbox(value=field.default, visible=False, label=label)


def guidance_label(arg: str | None) -> str:
    """ "Guidance scale", naming the argument where the family reads another (Qwen-Image: true_cfg_scale)."""
    return "Guidance scale" if arg in (None, "guidance_scale") else f"Guidance scale ({arg})"


def steps_label(choices: tuple[int, ...]) -> str:
    return "Steps" if not choices else f"Steps (this model runs {', '.join(map(str, choices))})"


def _advanced_settings(p: ModelProfile, lim: Limits) -> dict[str, Any]:
    """The controls under "Advanced settings", by the API's parameter names (inside its accordion)."""
    negative_prompt = gr.Textbox(
        label="Negative prompt",
        value="",
        max_length=lim.max_prompt_chars,
        visible=p.supports_negative_prompt,
        elem_id="negative-prompt",
    )
    with gr.Row():
        seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, maximum=MAX_SEED, elem_id="seed")
        randomize_seed = gr.Checkbox(label="Randomize seed", value=True, elem_id="randomize-seed")
    with gr.Row():
        width = gr.Slider(
            lim.min_size,
            lim.max_size,
            value=p.default_width,
            step=lim.size_multiple,
            label="Width",
            elem_id="width",
        )
        height = gr.Slider(
            lim.min_size,
            lim.max_size,
            value=p.default_height,
            step=lim.size_multiple,
            label="Height",
            elem_id="height",
        )
    with gr.Row():
        num_inference_steps = gr.Slider(
            lim.min_steps,
            max(lim.max_steps, lim.min_steps + 1),
            value=p.default_steps,
            step=1,
            label=steps_label(lim.step_choices),
            elem_id="steps",
        )
        # The control drives the parameter the family reads (engine/model/family_table.py);
        # a guidance-distilled model has none: the control is hidden at its fixed value.
        guidance_scale = gr.Slider(
            lim.min_guidance,
            max(lim.max_guidance, lim.min_guidance + 0.1),
            value=p.default_guidance,
            step=0.1,
            label=guidance_label(p.guidance_arg),
            elem_id="guidance",
            visible=p.guidance_arg is not None,
        )
    # The sampler (the API's `scheduler`): "default" is the model's own; the others
    # where its family supports them (engine/model/samplers.py). Pasted parameters and
    # history restore fill it. Hidden where the model offers only its own.
    sampler = gr.Dropdown(
        [(f"default ({sampler_name(p.sampler)})", "default")]
        + [(name, name) for name in lim.samplers if name != "default"],
        value="default",
        label="Sampler",
        elem_id="sampler",
        visible=len(lim.samplers) > 1,
    )
    # The LoRA (the API's `lora`, `lora_scale`): "none" or a name loaded with
    # --lora; picking one moves the scale to the one its spec suggests. Hidden without any.
    with gr.Row(visible=any(m.loras for m in p.served)):  # several models: any of them has one
        lora = gr.Dropdown([NONE, *(info.name for info in p.loras)], value=NONE, label="LoRA", elem_id="lora")
        lora_scale = gr.Slider(SCALE_MIN, SCALE_MAX, value=1.0, step=0.05, label="LoRA scale", elem_id="lora-scale")
    # Step caching (the API's `step_cache`, issue 50): per request, in the model's step-level loops.
    # Hidden where the model offers no method (its family runs no loop, or step joining is off).
    step_cache = gr.Dropdown(
        [(f"default (the server's: {lim.step_cache})", "default"), ("off", "off"),
         (f"auto ({lim.step_caches[0] if lim.step_caches else 'off'})", "auto"),
         *((name, name) for name in lim.step_caches)],
        value="default",
        label="Step cache",
        info="Skips some denoising steps, predicted from the last ones: about 2x faster (taylorseer computes 10 "
        "of 20 steps) for a little detail",
        elem_id="step-cache",
        visible=bool(lim.step_caches),
    )  # fmt: skip
    with gr.Row():
        num_images = gr.Slider(1, lim.max_images, value=1, step=1, label="Number of images", elem_id="num-images")
        # Off for API callers (the component's default); the page turns it on on load.
        # A model without previews says so here (and at start, and in /health): never silently off.
        live_preview = gr.Checkbox(
            label="Live preview",
            value=False,
            elem_id="live-preview",
            interactive=p.previews,
            info=None if p.previews else f"Live previews are off for this model: {p.preview_note}",
        )
    return dict(
        negative_prompt=negative_prompt, seed=seed, randomize_seed=randomize_seed, width=width,
        height=height, num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
        scheduler=sampler, lora=lora, lora_scale=lora_scale, num_images=num_images, live_preview=live_preview,
        step_cache=step_cache,
    )  # fmt: skip


def _paste_panel(lim: Limits) -> tuple[gr.Textbox, gr.Button, gr.HTML]:
    """Paste parameters: the text box, its button and the notes (inside its accordion)."""
    paste_text = gr.Textbox(
        label="Parameters text (AUTOMATIC1111 format, as in this app's PNGs)",
        placeholder="a prompt\nNegative prompt: ...\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512",
        lines=4,
        max_length=4 * lim.max_prompt_chars,
        elem_id="paste-text",
    )
    paste_button = gr.Button("Apply to the controls", size="sm", elem_id="paste-apply")
    paste_notes = gr.HTML("", elem_id="paste-notes")  # plain text: the notes quote the paste
    return paste_text, paste_button, paste_notes


def _history_panel() -> tuple[gr.Gallery, gr.Button, gr.File]:
    """The tab's history: the gallery, Download all and its file (inside its accordion)."""
    history_gallery = gr.Gallery(
        label="History (select an image to restore its parameters)",
        interactive=False,
        format="png",
        columns=8,
        fit_columns=False,
        height=200,  # one row in view; the rest scroll
        allow_preview=False,
        elem_id="history",
        buttons=["download"],
    )
    with gr.Row():
        download_button = gr.Button("Download all (zip)", size="sm", elem_id="download-all", scale=0)
        history_zip = gr.File(label="All images (zip)", visible=False, elem_id="history-zip", scale=2)
    return history_gallery, download_button, history_zip


def _wire_generate(
    adapter: Adapter,
    demo: gr.Blocks,
    settings: Settings,
    site: Site,
    triggers: list[Any],
    inputs: tuple[list[Any], list[Any]],
    outputs: tuple[gr.Gallery, gr.JSON, gr.HTML],
    stop_button: gr.Button,
    panels: tuple[dict[str, Any], dict[str, Any]],
) -> Any:
    """The page's and the API's generate events, and Stop; returns the page's event (for the history).
    ``inputs``: the page's (its mask painted in an editor) and the API's (its mask an uploaded image).
    The page's event reads the mask editor's and the control pad's values from the hidden inputs
    Generate's first step fills (``mode_panel.hold_mask``): no editor is an input of an event with a
    handler. ``panels``: the mode's controls and the ControlNet panel."""
    gallery, info, status = outputs
    held_step, held, held_map = hold_mask(triggers, *panels)
    page_pictures = {FIELDS.index("mask"): held, FIELDS.index("control_image"): held_map}
    page_inputs = [page_pictures.get(i, block) for i, block in enumerate(inputs[0])]
    api_inputs = inputs[1]
    # Two events, one handler, one shared concurrency limit: the page's (with a progress bar
    # as a third output) and the API's `/generate` (images + info, as documented). Gradio admits
    # handlers in arrival order, so whatever waited for a slot would wait in front of the app's fair
    # line: the limit is twice what the app admits (``Settings.handler_slots``), every admitted
    # request waits in the fair line, and the adapter answers "queue full" past ``Settings.admitted``.
    # preprocess=False: raw values reach our own validator, which names the field and the
    # range (the components' preprocess answers some bad values anonymously). postprocess=False:
    # the handler runs the components' postprocess itself, on the loop (outputs.Postprocess:
    # Gradio would hop to a worker thread per output per yield). validator=: the
    # same checks run when the request joins Gradio's queue, so a bad one is answered at once,
    # not after waiting for a handler slot; the handler validates again, as a backstop.
    shared: dict[str, Any] = dict(
        concurrency_limit=settings.handler_slots(),
        concurrency_id="generate",
        preprocess=False,
        postprocess=False,  # the handler postprocesses its own yields (outputs.Postprocess)
    )
    page_jobs = PageJobs()
    generate_event = held_step.then(
        fn=make_generate(adapter, demo, ui=True, page_jobs=page_jobs, outputs=[gallery, info, status], site=site),
        inputs=page_inputs,
        outputs=[gallery, info, status],
        api_name="generate_ui",
        api_visibility="private",
        validator=make_validator(adapter, ui=True),  # the page's values as its mode reads them
        js=remember_before_js(FIELDS),  # the inputs as they are; the slider's "before" kept in the page
        # The page's own status line shows the progress and what went wrong; Gradio's tracker
        # would put its pending overlay, or its "Error", over the last results.
        show_progress="hidden",
        **shared,
    )
    # Refused when it joins (the validator: Gradio shows the message at the field, and neither the
    # event's outputs nor its .failure() hear of it), the status line says so too, instead of the
    # last "done in ..." beside a new error.
    gr.on(triggers=triggers, fn=None, js=REFUSED_JS, api_visibility="private", show_progress="hidden")
    api_button = gr.Button(visible=False)  # the API-only trigger: never shown, never clicked
    api_button.click(
        fn=make_generate(adapter, demo, outputs=[gallery, info], site=site),
        inputs=api_inputs,
        outputs=[gallery, info],
        api_name="generate",
        validator=make_validator(adapter),
        **shared,
    )

    # Stop cancels this browser session's own job only; Gradio scopes cancels to the session.
    # A cancelled handler sends no last output, so Stop's own handler says "stopped", once the
    # session's job has really ended (see PageJobs): after its last progress output.
    async def stopped(request: gr.Request) -> str:
        session = request.session_hash
        if session and not await page_jobs.wait_ended(session, STOP_WAIT_SECONDS):
            log.warning("Stop: the job of session %s had not ended after %.0f s", session, STOP_WAIT_SECONDS)
        return status_html("stopped")

    # The cancel first, then the wait: with fn and cancels on one listener, Gradio registers the
    # fn first and the page awaits it before it sends the cancel (the wait would time out).
    stop_button.click(fn=None, cancels=[generate_event], api_visibility="private").then(
        fn=stopped,
        inputs=None,
        outputs=[status],
        api_visibility="private",
        concurrency_id="stop",  # it waits (async, no thread) for the job to end: a slot per request in flight
        concurrency_limit=settings.handler_slots(),
        show_progress="hidden",
    )
    return generate_event

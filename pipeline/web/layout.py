"""The Blocks page: controls, gallery and info, the page's and the API's events, Stop."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from ..config import Settings
from ..default_model import EXAMPLE_PROMPTS, GENERIC_PROMPTS
from ..request import MAX_SEED
from ..serving.base import Adapter
from .handler import PageJobs, make_generate, make_validator, reuse_seed, selected_index, status_html
from .mcp_tool import serve_images

log = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 60.0  # how long Stop waits for the session's job to end before saying "stopped" anyway


def build_demo(adapter: Adapter, settings: Settings) -> gr.Blocks:
    p, lim = adapter.profile, adapter.limits
    with gr.Blocks(title="Text to image") as demo:
        gr.Markdown(
            f"## Text to image\nModel: `{p.name}` on {p.device} ({p.dtype}). "
            "Many people can queue; the GPU draws one job at a time."
        )
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(
                    label="Prompt",
                    placeholder=EXAMPLE_PROMPTS[0] if settings.model is None else GENERIC_PROMPTS[0],
                    lines=1,  # one line, so Enter submits (Gradio inserts a newline when lines > 1)
                    max_lines=4,
                    max_length=lim.max_prompt_chars,
                    elem_id="prompt",
                )
                negative_prompt = gr.Textbox(
                    label="Negative prompt",
                    value="",
                    max_length=lim.max_prompt_chars,
                    visible=p.supports_negative_prompt,
                    elem_id="negative-prompt",
                )
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", elem_id="generate", scale=3)
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=1)
                with gr.Row():
                    seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, maximum=MAX_SEED)
                    randomize_seed = gr.Checkbox(label="Randomize seed", value=True)
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
                        lim.min_steps, lim.max_steps, value=p.default_steps, step=1, label="Steps", elem_id="steps"
                    )
                    guidance_scale = gr.Slider(
                        lim.min_guidance, lim.max_guidance, value=p.default_guidance, step=0.1, label="Guidance scale"
                    )
                with gr.Row():
                    num_images = gr.Slider(1, lim.max_images, value=1, step=1, label="Number of images")
                    # Off for API callers (the component's default); the page turns it on on load.
                    live_preview = gr.Checkbox(label="Live preview", value=False, elem_id="live-preview")
                # Prompts the embedded model was trained to draw; any other model gets ordinary ones.
                gr.Examples(
                    examples=[[e] for e in (EXAMPLE_PROMPTS if settings.model is None else GENERIC_PROMPTS)],
                    inputs=[prompt],
                    label="Example prompts",
                    elem_id="examples",
                )
            with gr.Column(scale=3):
                status = gr.HTML(status_html("ready"), elem_id="status")
                gallery = gr.Gallery(
                    label="Images",
                    format="png",
                    columns=2,
                    height="auto",
                    elem_id="gallery",
                    buttons=["download", "fullscreen"],
                )
                reuse_button = gr.Button("Reuse this image's seed", size="sm", elem_id="reuse-seed")
                info = gr.JSON(label="Info: seed, parameters and timings", elem_id="info")
                selected = gr.State(0)
        inputs = [
            prompt,
            negative_prompt,
            seed,
            randomize_seed,
            width,
            height,
            num_inference_steps,
            guidance_scale,
            num_images,
            live_preview,
        ]
        # Two events, one handler, one shared concurrency limit: the page's (with a progress bar
        # as a third output) and the API's `/generate` (images + info, as documented). Their
        # `concurrency_limit` counts requests in flight in the handler (preparing, waiting for the
        # gate, inferring, finalizing); finite, so queue(max_size) really bounds the rest.
        # preprocess=False: raw values reach our own validator, which names the field and the
        # range (the components' preprocess answers some bad values anonymously). validator=: the
        # same checks run when the request joins Gradio's queue, so a bad one is answered at once,
        # not after waiting for a handler slot; the handler validates again, as a backstop.
        shared: dict[str, Any] = dict(
            concurrency_limit=settings.concurrency,
            concurrency_id="generate",
            preprocess=False,
            validator=make_validator(adapter),
        )
        page_jobs = PageJobs()
        generate_event = gr.on(
            triggers=[generate_button.click, prompt.submit],
            fn=make_generate(adapter, demo, ui=True, page_jobs=page_jobs),
            inputs=inputs,
            outputs=[gallery, info, status],
            api_name="generate_ui",
            api_visibility="private",
            **shared,
        )
        api_button = gr.Button(visible=False)  # the API-only trigger: never shown, never clicked
        api_button.click(
            fn=make_generate(adapter, demo), inputs=inputs, outputs=[gallery, info], api_name="generate", **shared
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
            concurrency_id="ui",
            concurrency_limit=None,
            show_progress="hidden",
        )
        gallery.select(
            fn=selected_index,
            inputs=None,
            outputs=[selected],
            api_visibility="private",
            concurrency_id="ui",
            concurrency_limit=None,
        )
        reuse_button.click(
            fn=reuse_seed,
            inputs=[info, selected],
            outputs=[seed, randomize_seed],
            api_visibility="private",
            concurrency_id="ui",
            concurrency_limit=None,
        )
        demo.load(fn=None, outputs=[live_preview], js="() => true", api_visibility="private")
    if settings.mcp:  # the `generate` MCP tool answers with image content and the info as JSON text
        serve_images(demo)
    demo.queue(max_size=settings.queue_size, api_open=False, default_concurrency_limit=1)
    return demo

"""The server designs the benchmark compares, each a real launched Gradio app with the same API.

    python -m bench.servers --design gated|whole_lock|no_gate|on_loop --port P [app flags...]

- gated:      this app (narrow gate around the inference, one model thread)
- whole_lock: this app with concurrency_limit=1 on the event (the whole handler serialized)
- no_gate:    a thread per request calling the one pipeline (asyncio.to_thread, no gate)
- on_loop:    the pipeline called directly inside the async handler (blocks the event loop)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import threading
import time
from typing import Any

DESIGNS = ("gated", "whole_lock", "no_gate", "on_loop")


# Every benchmark client runs on this machine: one address standing in for many users. The app's
# per-address limits (issue 26: joins a second, open sessions, connections) and its cost budget
# would measure the front door's refusals instead of the serving; the benchmarks lift them.
ONE_ADDRESS = {
    "T2I_RATE_LIMIT": "1000000",
    "T2I_MAX_SESSIONS_PER_USER": "1000000",
    "T2I_MAX_CONNECTIONS_PER_ADDRESS": "100000",
    "T2I_MAX_PIXEL_STEPS": str(2**40),
}


def naive_demo(design: str, settings: Any) -> Any:
    import gradio as gr

    from pipeline.engine.model.loading import load_model
    from pipeline.request import limits_for, validate
    from pipeline.serving.postprocess import encode_pngs

    model = load_model(settings)
    limits = limits_for(settings, model.profile)

    async def generate(
        prompt: str,
        negative_prompt: str,
        seed: float,
        randomize_seed: bool,
        width: float,
        height: float,
        num_inference_steps: float,
        guidance_scale: float,
        num_images: float,
        live_preview: bool,
    ) -> tuple[list[str], dict[str, Any]]:
        raw = dict(
            prompt=prompt,
            negative_prompt=negative_prompt,
            seed=seed,
            randomize_seed=randomize_seed,
            width=width,
            height=height,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            num_images=num_images,
            live_preview=live_preview,
        )
        try:
            request = validate(raw, limits, model.count_tokens)
        except Exception as exc:
            raise gr.Error(str(exc)) from None
        job = request.to_job()
        if design == "no_gate":
            result = await asyncio.to_thread(model.generate, job, threading.Event(), lambda *_: None)
        else:
            result = model.generate(job, threading.Event(), lambda *_: None)
        paths = encode_pngs(
            result.images,
            settings.output_dir,
            request.request_id,
            request.parameters(),
            model.profile.name,
            model.profile.sampler,
        )
        return [str(p) for p in paths], {
            "status": "done",
            "request_id": request.request_id,
            "num_images": len(paths),
            "timings": {"infer_start": result.started, "infer_end": result.ended},
        }

    with gr.Blocks() as demo:
        inputs = [
            gr.Textbox(),
            gr.Textbox(value=""),
            gr.Number(value=0, precision=0),
            gr.Checkbox(value=True),
            gr.Number(value=limits.max_size // 2),
            gr.Number(value=limits.max_size // 2),
            gr.Number(value=20),
            gr.Number(value=7.5),
            gr.Number(value=1),
            gr.Checkbox(value=False),
        ]
        button = gr.Button()
        button.click(
            generate,
            inputs,
            [gr.Gallery(format="png"), gr.JSON()],
            api_name="generate",
            concurrency_limit=settings.concurrency,
            preprocess=False,
        )
    demo.queue(max_size=settings.queue_size, api_open=False)

    from fastapi.responses import JSONResponse
    from fastapi.routing import APIRoute

    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return demo, [APIRoute("/health", health, methods=["GET"])]


def main(argv: list[str] | None = None) -> None:
    import app
    from pipeline import allocator
    from pipeline.config import load_settings

    allocator.tune()  # as app.main does; every design gets it, so the designs differ only in design

    parser = argparse.ArgumentParser()
    parser.add_argument("--design", choices=DESIGNS, default="gated")
    args, rest = parser.parse_known_args(argv)
    settings = load_settings(rest)
    if args.design in ("gated", "whole_lock"):
        if args.design == "whole_lock":
            settings = dataclasses.replace(settings, concurrency=1)
        demo, adapter = app.create_app(settings)
        app.launch(demo, adapter, settings)
    else:
        settings = dataclasses.replace(settings, concurrency=64)
        demo, routes = naive_demo(args.design, settings)
        demo.launch(
            server_name=settings.host,
            server_port=settings.port,
            ssr_mode=False,
            prevent_thread_lock=True,
            app_kwargs={"routes": routes},
            quiet=True,
        )
    serve_forever()


def serve_forever() -> None:
    """Say READY (what ``bench.harness.Server`` waits for), then keep the launched app serving."""
    print("READY", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

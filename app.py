"""Text-to-image demo: a Gradio Blocks UI that admits many users and runs one inference at a time.

    python app.py [--model HUB_ID_OR_PATH] [--host 0.0.0.0] [--port 7860] [--share] ...

This is the only module that knows Gradio's error type. The work itself lives in ``pipeline/``:
the Blocks queue admits and bounds requests, ``LocalAdapter`` gates only the diffusion inference,
and the ``gpu-worker`` thread owns the model.
"""

from __future__ import annotations

import os

# Gradio's analytics would phone home from every event; this machine (and many Spaces) can't reach
# it, and it costs a thread per event. Set before gradio is imported, unless the user chose.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# After every event Gradio's queue rebuilds a pandas summary of up to 10,000 past events on a
# worker thread, only for its /monitoring page (off here; /metrics replaces it). That is GIL time
# taken from the event loop and the model thread on every request: keep one record, never recompute.
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(10**12))
os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1")

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import html  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, AsyncIterator, Callable, Sequence  # noqa: E402

import gradio as gr  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402
from fastapi.responses import JSONResponse, Response  # noqa: E402
from fastapi.routing import APIRoute  # noqa: E402
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: E402

from pipeline.adapter import LocalAdapter, Step, Waiting  # noqa: E402
from pipeline.config import Settings, load_settings  # noqa: E402
from pipeline.errors import Cancelled, InvalidRequest, RetryLater, ServingError  # noqa: E402
from pipeline.request import MAX_SEED, limits_for, new_request_id  # noqa: E402
from pipeline.shapes import EXAMPLE_PROMPTS, GENERIC_PROMPTS  # noqa: E402
from pipeline.sweeper import Sweeper  # noqa: E402
from pipeline.worker import GpuWorker  # noqa: E402

log = logging.getLogger("app")

PROGRESS_INTERVAL = 0.25  # seconds between streamed progress outputs of one request
STOP_WAIT_SECONDS = 60.0  # how long Stop waits for the session's job to end before saying "stopped" anyway
QUEUE_POLL_SECONDS = 0.005  # how often Gradio's dispatcher looks for new work when idle; see tune_queue
LOG_FORMAT = "%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"


def caller_alive(demo: gr.Blocks) -> Callable[[], bool] | None:
    """Whether the caller of the current event is still connected, read from Gradio's queue.

    Gradio marks an event dead the moment its client's stream closes, but the handler only hears
    of it at its next yield, one denoising step later. Polling the flag lets the model stop at the
    end of the step in progress. Best effort: if the event cannot be found, it counts as alive.
    """
    from gradio.context import LocalContext

    event_id = LocalContext.event_id.get(None)
    queue = demo._queue  # noqa: SLF001
    if event_id is None or queue is None:
        return None

    def alive() -> bool:
        event = queue.event_ids_to_events.get(event_id)
        return event is None or bool(event.alive)

    return alive


class PageJobs:
    """The page's generate handlers still running, per browser session (Gradio's session hash).

    Stop answers "stopped" only once the session's handlers have ended. Gradio's frontend sends
    Stop's ``/cancel`` without waiting for it and renders the cancelled event's outputs until the
    server closes it; a status written on a timer in the browser was overwritten by progress that
    was still coming whenever the cancel took longer than the timer (a loaded 2-core CI machine).
    Answered from the server after the handler's end, "stopped" follows the job's last output on
    the session's one ordered stream. Event-loop only, like the handlers.
    """

    def __init__(self) -> None:
        self._running: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def running(self, session: str | None):  # noqa: ANN201
        if session is None:
            yield
            return
        ended = asyncio.Event()
        self._running.setdefault(session, set()).add(ended)
        try:
            yield
        finally:
            ended.set()
            jobs = self._running.get(session, set())
            jobs.discard(ended)
            if not jobs:
                self._running.pop(session, None)

    def count(self, session: str) -> int:
        return len(self._running.get(session, ()))

    async def wait_ended(self, session: str, timeout: float) -> bool:
        """Wait until every handler the session has running now has ended; False on timeout."""
        pending = [ended.wait() for ended in self._running.get(session, ())]
        if not pending:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*pending), timeout)
        except TimeoutError:
            return False
        return True


def current_session() -> str | None:
    from gradio.context import LocalContext

    return getattr(LocalContext.request.get(None), "session_hash", None)


def status_html(text: str, step: int | None = None, total: int | None = None) -> str:
    """The UI's own progress line: Gradio hides its progress bar once a handler streams outputs."""
    bar = f'<progress max="{total}" value="{step}" style="width:100%"></progress>' if total else ""
    return f'<div class="t2i-status">{bar}<span>{html.escape(text)}</span></div>'


def gallery_items(paths: Sequence[Path], info: dict[str, Any]) -> list[tuple[str, str]]:
    """Each image with its caption: its own seed and the time it took (the request's time over its images)."""
    each = info["durations_ms"]["total"] / 1000 / max(1, len(paths))
    return [(str(p), f"seed {seed} · {each:.2f} s") for p, seed in zip(paths, info["seeds"])]


def selected_index(event: gr.SelectData) -> int:
    return int(event.index) if isinstance(event.index, int) else 0


def reuse_seed(info: Any, selected: Any) -> tuple[Any, Any]:
    """The seed of the selected image (the first if none was selected) into the seed box, randomize off."""
    seeds = info.get("seeds") if isinstance(info, dict) else None
    if not seeds:
        raise gr.Error("Generate an image first, then pick it in the gallery.", title="No image yet")
    index = selected if isinstance(selected, int) and 0 <= selected < len(seeds) else 0
    return seeds[index], False


def make_generate(adapter: LocalAdapter, demo: gr.Blocks, *, ui: bool = False,  # noqa: ANN201
                  page_jobs: PageJobs | None = None):
    """The generate handler. Its parameter names are the API's parameter names.

    It is an async generator that yields at every step, so Gradio reaches it at once when the
    client cancels or goes away; closing it closes ``adapter.run``, which stops the model thread.
    Intermediate outputs are progress records (``status`` waiting/running) and, with
    ``live_preview``, a rough preview image; the last output has ``status`` done. The UI's
    variant (``ui=True``) adds a third output: a progress bar with "step k/N", and registers
    itself in ``page_jobs`` while it runs, for Stop.
    """
    width_of_output = 3 if ui else 2

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
        progress: gr.Progress = gr.Progress(),
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Generate images from a text prompt with a diffusion model (one GPU, shared through a queue).

        Returns the images and an info record with the seeds, the parameters used and timings.

        Args:
            prompt: What to draw, in plain English (for the default model, e.g. "a red circle on a blue background").
            negative_prompt: What to avoid; may be empty.
            seed: Seed of the first image (image i uses seed + i); ignored when randomize_seed is true.
            randomize_seed: Pick a random seed (and report it in the info record).
            width: Image width in pixels, a multiple of the model's size step.
            height: Image height in pixels, a multiple of the model's size step.
            num_inference_steps: Denoising steps; more is slower and usually finer.
            guidance_scale: How strictly to follow the prompt (classifier-free guidance).
            num_images: How many images to generate.
            live_preview: Stream rough preview images while denoising.
        """
        raw = {
            "prompt": prompt,
            "negative_prompt": negative_prompt,
            "seed": seed,
            "randomize_seed": randomize_seed,
            "width": width,
            "height": height,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "num_images": num_images,
            "live_preview": live_preview,
        }
        request_id = new_request_id()
        last_yield = 0.0
        tracking = page_jobs.running(current_session()) if page_jobs is not None else contextlib.nullcontext()
        with tracking:
            try:
                alive = caller_alive(demo)
                async with contextlib.aclosing(adapter.run(raw, request_id=request_id, alive=alive)) as events:
                    async for event in events:
                        if isinstance(event, Waiting):
                            text = f"waiting for the GPU: {event.ahead} ahead" if event.ahead else "starting"
                            progress(0.0, desc=text)
                            record = {"status": "waiting", "ahead": event.ahead, "request_id": request_id}
                            # None, never gr.skip(): Gradio answers a skip (a prop update) by rebuilding the
                            # component and its JSON schema on the event loop, at every yield.
                            out: tuple[Any, ...] = (None, record, status_html(text))
                        elif isinstance(event, Step):
                            text = f"step {event.step}/{event.total}"
                            # Only records the step: Gradio's progress sender (see tune_queue) sends the
                            # latest one every PROGRESS_INTERVAL.
                            progress((event.step, event.total), desc=text, unit="steps")
                            # Every yield costs Gradio a diff and a message on the event loop, taking the
                            # GIL from the model thread: stream at most one progress output per
                            # PROGRESS_INTERVAL, always the last step and every preview. With previews
                            # on, only preview steps yield, so the gallery keeps the latest preview.
                            now = time.monotonic()
                            if event.step < event.total and event.preview is None and (
                                live_preview is True or now - last_yield < PROGRESS_INTERVAL
                            ):
                                continue
                            last_yield = now
                            preview = [event.preview] if event.preview is not None else None
                            record = {"status": "running", "step": event.step, "total": event.total,
                                      "request_id": request_id}
                            out = (preview, record, status_html(text, event.step, event.total))
                        else:
                            for warning in event.info["warnings"]:
                                gr.Warning(warning)
                            took = event.info["durations_ms"]["total"] / 1000
                            out = (gallery_items(event.paths, event.info), {"status": "done", **event.info},
                                   status_html(f"done in {took:.2f} s"))
                        yield out[:width_of_output]
            except InvalidRequest as exc:
                raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None
            except RetryLater as exc:
                raise gr.Error(str(exc), title="Please retry", print_exception=False) from None
            except Cancelled:
                log.info("request %s cancelled", request_id)
                return
            except ServingError as exc:
                raise gr.Error(str(exc), print_exception=False) from None
            except Exception:
                log.exception("request %s failed", request_id)
                raise gr.Error(
                    f"Internal error (request id {request_id}). Please try again.", print_exception=False
                ) from None

    return generate


def build_demo(adapter: LocalAdapter, settings: Settings) -> gr.Blocks:
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
                    width = gr.Slider(lim.min_size, lim.max_size, value=p.default_width, step=lim.size_multiple, label="Width")
                    height = gr.Slider(lim.min_size, lim.max_size, value=p.default_height, step=lim.size_multiple, label="Height")
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
                gallery = gr.Gallery(label="Images", format="png", columns=2, height="auto", elem_id="gallery",
                                     buttons=["download", "fullscreen"])
                reuse_button = gr.Button("Reuse this image's seed", size="sm", elem_id="reuse-seed")
                info = gr.JSON(label="Info: seed, parameters and timings", elem_id="info")
                selected = gr.State(0)
        inputs = [prompt, negative_prompt, seed, randomize_seed, width, height, num_inference_steps,
                  guidance_scale, num_images, live_preview]
        # Two events, one handler, one shared concurrency limit: the page's (with a progress bar
        # as a third output) and the API's `/generate` (images + info, as documented). Their
        # `concurrency_limit` counts requests in flight in the handler (preparing, waiting for the
        # gate, inferring, finalizing); finite, so queue(max_size) really bounds the rest.
        # preprocess=False: raw values reach our own validator, which names the field and the
        # range (the components' preprocess answers some bad values anonymously).
        shared = dict(concurrency_limit=settings.concurrency, concurrency_id="generate", preprocess=False)
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
            fn=stopped, inputs=None, outputs=[status], api_visibility="private", concurrency_id="ui",
            concurrency_limit=None, show_progress="hidden",
        )
        gallery.select(fn=selected_index, inputs=None, outputs=[selected], api_visibility="private",
                       concurrency_id="ui", concurrency_limit=None)
        reuse_button.click(fn=reuse_seed, inputs=[info, selected], outputs=[seed, randomize_seed],
                           api_visibility="private", concurrency_id="ui", concurrency_limit=None)
        demo.load(fn=None, outputs=[live_preview], js="() => true", api_visibility="private")
    demo.queue(max_size=settings.queue_size, api_open=False, default_concurrency_limit=1)
    return demo


def create_app(settings: Settings, load: Any = None) -> tuple[gr.Blocks, LocalAdapter]:
    """Start the model side (waits for the model to load) and build the UI around it.

    ``--backend local``: one ``gpu-worker`` thread in this process under a ``LocalAdapter``.
    ``--backend ray``: ``--replicas`` Ray Serve replicas, each with its own model thread and gate,
    under a ``RayAdapter`` (``pipeline/ray_backend.py``). ``load`` replaces the real loader (tests
    inject a fake model through it; local backend only).
    """
    adapter: Any
    if settings.backend == "ray":
        from pipeline import ray_backend

        cluster = ray_backend.start(settings)
        try:
            adapter = ray_backend.RayAdapter(cluster, settings)
        except BaseException:
            ray_backend.stop(cluster)
            raise
    else:
        if load is None:
            from pipeline.model import load_model

            def load() -> Any:
                return load_model(settings)

        worker = GpuWorker(load)
        profile = worker.start()
        adapter = LocalAdapter(worker, limits_for(settings, profile), settings.output_dir,
                               job_timeout=settings.job_timeout, max_batch_size=settings.max_batch_size)
    # The app's own sweeper keeps its outputs and Gradio's copies of them within budget.
    sweeper = Sweeper(
        [settings.output_dir, Path(get_upload_folder())],
        max_bytes=settings.output_max_mb * 2**20,
        max_age=settings.output_max_age_minutes * 60,
        interval=settings.sweep_interval,
        min_age=min(10.0, settings.sweep_interval),
    )
    adapter.on_close(sweeper.stop)
    sweeper.start()
    adapter.metrics.watch_disk(lambda: sweeper.last)
    return build_demo(adapter, settings), adapter


def service_routes(demo: gr.Blocks, adapter: LocalAdapter) -> list[APIRoute]:
    """``/health`` (JSON) and ``/metrics`` (Prometheus text), served by the app's own server."""

    async def health() -> JSONResponse:
        body = adapter.health()
        waiting_in_gradio = len(demo._queue) if demo._queue is not None else 0  # noqa: SLF001
        body["queue_depth"] = body["gpu_queue_depth"] + waiting_in_gradio
        return JSONResponse(body, status_code=503 if body["status"] == "dead" else 200)

    async def metrics() -> Response:
        return Response(adapter.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def no_uploads() -> JSONResponse:
        # A text-only app takes no files; Gradio's upload route would store anyone's file and
        # echo its absolute server path. Listed before Gradio's own routes, so it wins.
        return JSONResponse({"detail": "This app accepts no uploads."}, status_code=403)

    return [
        APIRoute("/health", health, methods=["GET"], include_in_schema=False),
        APIRoute("/metrics", metrics, methods=["GET"], include_in_schema=False),
        APIRoute("/gradio_api/upload", no_uploads, methods=["POST"], include_in_schema=False),
    ]


def tune_queue(demo: gr.Blocks) -> None:
    """Slow Gradio's two polling loops, which on Linux wake the event loop 1,100 times a second.

    Its dispatcher sleeps 1 ms whenever nothing is waiting (``sleep_when_free``) and its progress
    sender 10 ms; each wake-up takes the GIL from the model thread between two torch ops. At
    QUEUE_POLL_SECONDS a new event waits at most that long to start, and progress is sent as often
    as the handler streams it anyway.
    """
    queue = demo._queue  # noqa: SLF001
    if queue is not None:
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_SECONDS)
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, PROGRESS_INTERVAL)


def launch(demo: gr.Blocks, adapter: LocalAdapter, settings: Settings) -> None:
    """Start serving in the background (the server runs on its own thread and event loop)."""
    tune_queue(demo)
    demo.launch(
        server_name=settings.host,
        server_port=settings.port,
        share=settings.share,
        ssr_mode=False,
        show_error=False,
        max_file_size="1mb",
        prevent_thread_lock=True,
        app_kwargs={"routes": service_routes(demo, adapter)},
        auth=settings.auth_pair(),
        mcp_server=settings.mcp,
    )


def shutdown(demo: gr.Blocks, adapter: LocalAdapter, deadline: float = 8.0) -> None:
    """Stop admitting, answer the queued, stop the running job at its next step, then close.

    A plain ``demo.close()`` mid-job gives clients ``KeyError('unexpected_error')``; here every
    queued or running request is answered with "the server is shutting down, please retry" first.
    """
    end = time.monotonic() + deadline
    adapter.begin_shutdown()
    while time.monotonic() < end:
        queued = len(demo._queue) if demo._queue is not None else 0  # noqa: SLF001
        if queued == 0 and adapter.in_flight == 0:
            break
        time.sleep(0.05)
    time.sleep(min(0.5, max(0.0, end - time.monotonic())))  # let the last error messages go out
    demo.close()
    adapter.shutdown_model(timeout=max(0.5, end - time.monotonic()))
    adapter.close()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    settings = load_settings(argv)
    demo, adapter = create_app(settings)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    launch(demo, adapter, settings)
    while not stop.wait(0.5):
        pass
    shutdown(demo, adapter)
    log.info("stopped")


if __name__ == "__main__":
    main()

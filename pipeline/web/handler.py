"""The generate handler (its parameter names are the API's) and the page's Stop bookkeeping.

This is the only module that turns serving errors into Gradio's error type.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import time
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Iterator, Sequence

import gradio as gr

from ..errors import Cancelled, InvalidRequest, RetryLater, ServingError
from ..request import new_request_id
from ..serving.base import Adapter
from ..serving.events import Step, Waiting
from .gradio_internals import caller_alive, current_session

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.25  # seconds between streamed progress outputs of one request


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
    def running(self, session: str | None) -> Iterator[None]:
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


def progress_gallery() -> Any:
    """The gallery's value in a progress output: None, never ``gr.skip()``.

    Gradio answers a skip (a prop update) by rebuilding the component and its JSON schema on the
    event loop, at every yield.
    """
    return None


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


def make_generate(
    adapter: Adapter, demo: gr.Blocks, *, ui: bool = False, page_jobs: PageJobs | None = None
) -> Callable[..., AsyncGenerator[tuple[Any, ...], None]]:
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
    ) -> AsyncGenerator[tuple[Any, ...], None]:
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
        previewed = False  # a preview is on screen
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
                            out: tuple[Any, ...] = (progress_gallery(), record, status_html(text))
                        elif isinstance(event, Step):
                            text = f"step {event.step}/{event.total}"
                            # Only records the step: Gradio's progress sender (see tune_queue) sends the
                            # latest one every PROGRESS_INTERVAL.
                            progress((event.step, event.total), desc=text, unit="steps")
                            # Every yield costs Gradio a diff and a message on the event loop, taking the
                            # GIL from the model thread: stream at most one progress output per
                            # PROGRESS_INTERVAL, always the last step and every preview. Once a preview
                            # is on screen only preview steps yield, so the gallery keeps it (a
                            # progress output sends no picture); before that, "step k/N" still flows.
                            now = time.monotonic()
                            if (
                                event.step < event.total
                                and event.preview is None
                                and (previewed or now - last_yield < PROGRESS_INTERVAL)
                            ):
                                continue
                            last_yield = now
                            previewed = previewed or event.preview is not None
                            preview = [event.preview] if event.preview is not None else None
                            record = {
                                "status": "running",
                                "step": event.step,
                                "total": event.total,
                                "request_id": request_id,
                            }
                            out = (preview, record, status_html(text, event.step, event.total))
                        else:
                            for warning in event.info["warnings"]:
                                gr.Warning(warning)
                            took = event.info["durations_ms"]["total"] / 1000
                            out = (
                                gallery_items(event.paths, event.info),
                                {"status": "done", **event.info},
                                status_html(f"done in {took:.2f} s"),
                            )
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

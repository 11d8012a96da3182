"""The generate handler (its parameter names are the API's) and the page's Stop bookkeeping.

This is the only module that turns serving errors into Gradio's error type.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import html
import logging
import time
from pathlib import Path
from typing import Any, AsyncGenerator, Awaitable, Callable, Iterator, Sequence

import gradio as gr

from ..errors import Cancelled, InvalidRequest, RetryLater, ServingError, StorageFull
from ..request import FIELDS, new_request_id, validate
from ..serving.base import Adapter
from ..serving.events import Step, Waiting
from .gradio_internals import caller_alive, current_session
from .identity import Caller, TrustedProxies, caller_of
from .outputs import Postprocess, introspected_once
from .site import Site

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


class ProgressView:
    """What one request's caller sees of its progress: it says which events would change it.

    Every progress output costs Gradio a diff and a message on the event loop, and takes the GIL
    from the model thread, so the handler sends one only when a person would see something new:

    - "waiting for the GPU: k ahead" / "starting" when the text changes, never twice the same;
    - "step k/N" at most once per PROGRESS_INTERVAL, always N/N (the bar is full during the
      decode); previews too at most once per PROGRESS_INTERVAL after the first (a fast device
      makes more than a person can see: the latest one wins), and once a preview is on screen,
      only previews, N/N included (a progress output sends no picture: its gallery value, None,
      would blank the preview);
    - a 1-step job sends no step at all (its one step is followed by its images; its preview would
      be replaced by them at once) and no "starting" unless a "k ahead" is on screen to replace.
    """

    def __init__(self, num_inference_steps: Any, interval: float = PROGRESS_INTERVAL) -> None:
        self.one_step = num_inference_steps == 1  # a raw value: 1 or 1.0 (a bad one never gets here)
        self.interval = interval
        self.text: str | None = None  # the progress text on screen
        self.previewed = False  # a preview is on screen
        self.last_sent = 0.0

    def waiting(self, ahead: int, eta_seconds: float | None = None) -> str | None:
        """The text to send for ``Waiting(ahead)``, or None if the screen would not change."""
        text = f"waiting for the GPU: {ahead} ahead" if ahead else "starting"
        if ahead and eta_seconds is not None:
            text += f", about {duration_text(eta_seconds)}"
        if text == self.text or (self.one_step and not ahead and self.text is None):
            return None
        self.text = text
        return text

    def step(self, event: Step, now: float) -> bool:
        """Whether to send ``event`` (its "step k/N", and its preview if it has one)."""
        if event.total <= 1:
            return False
        if self.previewed and event.preview is None:
            return False  # a progress output sends no picture: it would blank the preview on screen
        last = event.step >= event.total
        if not last and now - self.last_sent < self.interval and (event.preview is None or self.previewed):
            return False  # coalesced: the caller needs the latest step (and preview), not every one
        self.last_sent = now
        self.previewed = self.previewed or event.preview is not None
        self.text = step_text(event)
        return True


def duration_text(seconds: float) -> str:
    """ "12 s", "2 min 5 s", "under 1 s": an estimate as a person reads it."""
    if seconds < 1:
        return "under 1 s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60} s" if whole % 60 else f"{whole // 60} min"


def step_text(event: Step) -> str:
    """ "step k/N", and the time left once it is known: "step 3/20 · 12 s left"."""
    text = f"step {event.step}/{event.total}"
    if event.eta_seconds is not None and event.step < event.total:
        text += f" · {duration_text(event.eta_seconds)} left"
    return text


def status_html(text: str, step: int | None = None, total: int | None = None) -> str:
    """The UI's own progress line: Gradio hides its progress bar once a handler streams outputs."""
    bar = f'<progress max="{total}" value="{step}" style="width:100%"></progress>' if total else ""
    return f'<div class="t2i-status">{bar}<span>{html.escape(text)}</span></div>'


def gallery_items(paths: Sequence[Path], info: dict[str, Any]) -> list[tuple[str, str]]:
    """Each image with its caption: its own seed and the time it took (the request's time over its images)."""
    each = info["durations_ms"]["total"] / 1000 / max(1, len(paths))
    return [(str(p), f"seed {seed} · {each:.2f} s") for p, seed in zip(paths, info["seeds"])]


def request_caller(
    request: gr.Request | None, trusted: TrustedProxies, profile: gr.OAuthProfile | None = None
) -> Caller | None:
    """Who is asking (``identity.caller_of``): the front door's answer for this request, with its login.

    The front door resolved the address when the request arrived (its state holds the ``Caller``);
    a request that did not pass it (a direct call, a test's ``gr.Request``) is resolved here the
    same way. None: no request at all.
    """
    if request is None:
        return None
    hf_user = getattr(profile, "username", None) if profile is not None else None
    state = getattr(request, "state", None)
    found = getattr(state, "t2i_caller", None) if state is not None else None
    if isinstance(found, Caller):
        return dataclasses.replace(found, login=request.username, hf_user=hf_user)
    client = getattr(request, "client", None)
    headers = getattr(request, "headers", None)
    pairs = list(headers.items()) if headers is not None else []
    peer = str(getattr(client, "host", None) or "")
    return caller_of(peer, pairs, trusted, login=request.username, hf_user=hf_user)


def selected_index(event: gr.SelectData) -> int:
    return int(event.index) if isinstance(event.index, int) else 0


def make_generate(
    adapter: Adapter,
    demo: gr.Blocks,
    *,
    ui: bool = False,
    page_jobs: PageJobs | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
    outputs: Sequence[Any] | None = None,
    site: Site | None = None,
) -> Callable[..., AsyncGenerator[tuple[Any, ...], None]]:
    """The generate handler. Its parameter names are the API's parameter names.

    It is an async generator, so Gradio's cancel reaches it at once (and a caller that goes away
    is noticed by the adapter's liveness watch); closing it closes ``adapter.run``, which stops
    the model thread. Intermediate outputs, only those a person would see change (ProgressView),
    are progress records (``status`` waiting/running) and, with
    ``live_preview``, a rough preview image; the last output has ``status`` done. The UI's
    variant (``ui=True``) adds a third output: a progress bar with "step k/N", and registers
    itself in ``page_jobs`` while it runs, for Stop.

    ``outputs``: the event's output components, when it is registered with ``postprocess=False``;
    the handler then postprocesses each yield itself (``Postprocess``).

    ``site``: the app's shared books: the page's variant files each result under its session
    there (the tab's history), and an MCP call's job stops when its caller disconnects.
    """
    trusted = site.trusted if site is not None else TrustedProxies.parse(None)
    width_of_output = 3 if ui else 2
    postprocess = Postprocess(outputs) if outputs is not None else None
    if postprocess is not None and len(postprocess.components) != width_of_output:
        raise ValueError(f"the generate event has {width_of_output} outputs; got {len(postprocess.components)}")

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
        scheduler: str,
        lora: str = "none",
        lora_scale: float = 1.0,
        progress: gr.Progress = gr.Progress(),
        request: gr.Request | None = None,  # injected by Gradio, not an API parameter
        profile: gr.OAuthProfile | None = None,  # injected by Gradio: the logged-in HF user, if any
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
            scheduler: The sampler: "default" (the model's own) or one of the names the model offers
                (Euler, Euler a, DPM++ 2M Karras, DDIM, UniPC where its family supports them).
            lora: A LoRA adapter the server loaded (--lora), by name, or "none".
            lora_scale: How strongly the adapter applies, from -2 to 2 (1: as trained).
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
            "scheduler": scheduler,
            "lora": lora,
            "lora_scale": lora_scale,
        }
        request_id = new_request_id()
        view = ProgressView(num_inference_steps, progress_interval)
        session = current_session()
        tracking = page_jobs.running(session) if page_jobs is not None else contextlib.nullcontext()
        with tracking:
            try:
                caller = request_caller(request, trusted, profile)
                alive = _alive(caller_alive(demo), caller, site)
                user = caller.key if caller is not None else None
                events = adapter.run(raw, request_id=request_id, alive=alive, user=user)
                async with contextlib.aclosing(events):
                    async for event in events:
                        if isinstance(event, Waiting):
                            if (text := view.waiting(event.ahead, event.eta_seconds)) is None:
                                continue
                            if not ui:
                                progress(0.0, desc=text)
                            record = {
                                "status": "waiting",
                                "ahead": event.ahead,
                                "eta_seconds": event.eta_seconds,
                                "request_id": request_id,
                            }
                            out: tuple[Any, ...] = (progress_gallery(), record, status_html(text))
                        elif isinstance(event, Step):
                            if event.total <= 1:
                                continue  # a 1-step job: no progress at all, its images follow
                            text = step_text(event)
                            # Only records the step, for API callers (their "progress" messages):
                            # Gradio's progress sender (see tune_queue) sends the latest one every
                            # PROGRESS_INTERVAL. Not on the page: its status line shows the step, and
                            # each progress message put Gradio's tracker back to its pending overlay
                            # over the gallery until the next output (the preview hidden half the time).
                            if not ui:
                                progress((event.step, event.total), desc=text, unit="steps")
                            if not view.step(event, time.monotonic()):
                                continue
                            shown = event.preview
                            # the encoded preview as its file (Postprocess), or as a picture where Gradio
                            # postprocesses the yield itself
                            preview = ([shown if postprocess is not None else shown.image()] if shown is not None
                                       else progress_gallery())  # fmt: skip
                            record = {
                                "status": "running",
                                "step": event.step,
                                "total": event.total,
                                "eta_seconds": event.eta_seconds,
                                "request_id": request_id,
                            }
                            out = (preview, record, status_html(text, event.step, event.total))
                        else:
                            for warning in event.info["warnings"]:
                                gr.Warning(warning)
                            if ui and site is not None:  # the tab's history: the server's own record
                                site.results.add(session, event.paths, event.info)
                            took = event.info["durations_ms"]["total"] / 1000
                            out = (
                                gallery_items(event.paths, event.info),
                                {"status": "done", **event.info},
                                status_html(f"done in {took:.2f} s"),
                            )
                        out = out[:width_of_output]
                        yield await postprocess(out) if postprocess is not None else out
            except InvalidRequest as exc:
                raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None
            except RetryLater as exc:
                raise gr.Error(str(exc), title="Please retry", print_exception=False) from None
            except Cancelled:
                log.info("request %s cancelled", request_id)
                return
            except ServingError as exc:
                raise gr.Error(str(exc), print_exception=False) from None
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # Gradio's own writes (a preview) on a full disk
                    raise gr.Error(str(StorageFull()), title="Please retry", print_exception=False) from None
                log.exception("request %s failed", request_id)
                raise gr.Error(
                    f"Internal error (request id {request_id}). Please try again.", print_exception=False
                ) from None
            except Exception:
                log.exception("request %s failed", request_id)
                raise gr.Error(
                    f"Internal error (request id {request_id}). Please try again.", print_exception=False
                ) from None

    return introspected_once(generate)


def _alive(
    gradio_alive: Callable[[], bool] | None, caller: Caller | None, site: Site | None
) -> Callable[[], bool] | None:
    """Whether the caller is still there: Gradio's view of the event and, for an MCP call, the front door's."""
    if caller is None or not caller.call or site is None:
        return gradio_alive
    calls, call = site.calls, caller.call

    def alive() -> bool:
        return calls.alive(call) and (gradio_alive is None or gradio_alive())

    return alive


def make_validator(adapter: Adapter) -> Callable[..., Awaitable[list[dict[str, Any]]]]:
    """Gradio's ``validator=`` for the generate events: the handler's own checks, at join time.

    Gradio 6.31 runs it in ``Queue.push``, before the event joins the queue, so a bad request is
    answered at once (HTTP 422: gradio_client raises ``ValidationError``; the page shows the
    message at the field) instead of after waiting for a handler slot behind running jobs. The
    checks and messages are ``request.validate``'s, without token counting (it only adds
    warnings and may need the model's tokenizer); the handler still validates, as a backstop.
    Async, so Gradio runs it on the loop (microseconds) rather than hopping to a worker thread.
    """

    async def check(*values: Any) -> list[dict[str, Any]]:
        try:
            validate(dict(zip(FIELDS, values)), adapter.limits)
        except InvalidRequest as exc:
            adapter.metrics.jobs.labels("rejected").inc()  # answered here, it never reaches the adapter
            bad = FIELDS.index(exc.field) if exc.field in FIELDS else 0
            return [gr.validate(i != bad, str(exc) if i == bad else "") for i in range(len(values))]
        return [gr.validate(True, "") for _ in values]

    return introspected_once(check)

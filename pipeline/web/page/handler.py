"""The generate handler (its parameter names are the API's) and the page's Stop bookkeeping.

This is the only module that turns serving errors into Gradio's error type.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import inspect
import logging
from pathlib import Path
from typing import Any, AsyncGenerator, Awaitable, Callable, Iterator, Sequence

import gradio as gr

from ... import fields
from ...controls import map_preview
from ...errors import Cancelled, InvalidRequest, RetryLater, ServingError, StorageFull
from ...request import FIELDS, gradio_checks, new_request_id, side_length, validate
from ...serving.base import Adapter
from ...uploads import MAX_UPLOAD_BYTES
from ..door.identity import Caller, TrustedProxies, caller_of
from ..door.upload_route import UPLOAD_FOLDER
from ..gradio_internals import caller_alive, current_session, forget_temp_files, served_names, upload_folder
from .mode_panel import page_values
from .outputs import Postprocess, introspected_once
from .shown import PROGRESS_INTERVAL, ProgressView, done_output, status_html, step_output, waiting_output
from .site import Site

log = logging.getLogger(__name__)


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

    async def generate(*args: Any, **kwargs: Any) -> AsyncGenerator[tuple[Any, ...], None]:
        # Gradio calls it by the signature below (``fields.TABLE``'s fields, then what it injects).
        arguments = SIGNATURE.bind(*args, **kwargs)
        arguments.apply_defaults()
        raw = fields.raw_from(arguments.arguments)
        progress, request, profile = (arguments.arguments[name] for name in ("progress", "request", "profile"))
        request_id = new_request_id()
        view = ProgressView(raw["num_inference_steps"], progress_interval)
        session = current_session()
        tracking = page_jobs.running(session) if page_jobs is not None else contextlib.nullcontext()
        with tracking:
            try:
                caller = request_caller(request, trusted, profile)
                alive = _alive(caller_alive(demo), caller, site)
                user = caller.key if caller is not None else None
                account = caller.account if caller is not None else None
                gradio_checks(raw)  # the validator's own, again: a call may skip the join-time validator
                if ui:
                    raw = page_values(raw)  # only what the page's mode reads
                if any(raw.get(name) is not None for name in UPLOADS):  # the uploads' bytes, read off the loop
                    raw, copies = await asyncio.to_thread(with_upload_bytes, raw)
                    forget_temp_files(demo, copies)  # Gradio's copies, read and deleted: nothing is left behind
                events = adapter.run(raw, request_id=request_id, alive=alive, user=user, account=account)
                async with contextlib.aclosing(events):
                    async for event in events:
                        if event.kind == "waiting":
                            out = waiting_output(event, view, request_id, None if ui else progress)
                        elif event.kind == "step":
                            out = step_output(
                                event, view, request_id, None if ui else progress, postprocess is not None
                            )
                        else:
                            first = event.first_pass  # a hires fix's: named off the loop (a copy may be made)
                            first_pass = await asyncio.to_thread(served_names, first) if first else []
                            out = done_output(event, site if ui else None, session, first_pass)
                        if out is None:
                            continue
                        out = out[:width_of_output]
                        yield await postprocess(out) if postprocess is not None else out
            except Cancelled:
                log.info("request %s cancelled", request_id)
                return
            except Exception as exc:
                error = _user_error(exc, request_id)
                if not ui:
                    raise error from None
                # The page keeps what it shows (the last results, their record) and says what went
                # wrong where the status is; a raised error would put Gradio's "Error" over them.
                gr.Warning(error.message, title=error.title or "Error")
                out = (gr.skip(), gr.skip(), status_html(f"Error: {error.message}"))
                yield await postprocess(out) if postprocess is not None else out

    generate.__signature__ = SIGNATURE  # type: ignore[attr-defined]
    generate.__annotations__ = {
        **{name: p.annotation for name, p in SIGNATURE.parameters.items()},
        "return": AsyncGenerator[tuple[Any, ...], None],
    }
    generate.__doc__ = DOC
    return introspected_once(generate)


# The fields (``fields.TABLE``), then what Gradio injects: the progress tracker, the request, the logged-in HF user.
SIGNATURE = fields.signature([
    inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress(),
                      annotation=gr.Progress),
    inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                      annotation=gr.Request | None),  # not an API parameter
    inspect.Parameter("profile", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                      annotation=gr.OAuthProfile | None),
])  # fmt: skip
DOC = fields.docstring(
    "Generate images from a text prompt with a diffusion model (one GPU, shared through a queue).\n\n"
    "Returns the images and an info record with the seeds, the parameters used and timings."
)


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


UPLOADS = ("image", "mask", "control_image")  # the fields that take an uploaded picture


def with_upload_bytes(raw: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """``raw`` with its image inputs' files as bytes, and the copies read (deleted once read).

    Gradio has copied each upload into its cache (the front door let in only the caller's own:
    ``upload_route``, which keeps the original for the caller's next request); a value naming any
    file outside Gradio's upload folder is refused, whatever let it in. The page's image editor
    sends its mask as a painted layer (strokes on a clear layer) and its picture as the background; the
    control pad its map as the composite (the picture and the strokes drawn over it)."""
    out, copies = dict(raw), set()
    for name in UPLOADS:
        value = raw.get(name)
        if isinstance(value, dict) and "layers" in value:  # gr.ImageEditor's value
            layers = [layer for layer in value.get("layers") or [] if isinstance(layer, dict)]
            if name == "mask":
                value = layers[0] if layers else None
            else:  # the control pad's map is its composite (``control_panel``); the mask editor's picture its own
                value = (value.get("composite") if name == "control_image" else None) or value.get("background")
        if value is None or isinstance(value, bytes):
            out[name] = value
            continue
        path = value.get("path") if isinstance(value, dict) else None
        folder = upload_folder().resolve()
        where = Path(path).resolve() if isinstance(path, str) else None
        if where is None or not where.is_relative_to(folder) or not where.is_file():
            raise InvalidRequest(name, f"{name} must be an image you uploaded (PNG, JPEG or WebP), not a URL or a path")
        with where.open("rb") as file:
            out[name] = file.read(MAX_UPLOAD_BYTES + 1)  # past the cap: read_image says so
        if where.parent.name != UPLOAD_FOLDER:  # Gradio's copy, not the caller's kept upload
            where.unlink(missing_ok=True)
            copies.add(str(path))
    return out, copies


def make_preview(adapter: Adapter, demo: gr.Blocks, site: Site) -> Callable[..., Awaitable[Any]]:
    """The page's "Show the map" (``control_panel.wire_preview``): the map a request with the pad's value
    would give the model, at the picture's size. The pad's files as the generate handler reads them (the
    caller's own uploads: the front door checked them), decoded and preprocessed on the decode threads
    in the caller's turn (``serving.decoding``): a preview holds neither the loop nor a shared pool."""
    limits = adapter.limits

    async def preview(pad: Any, preprocess: Any, width: Any, height: Any, request: gr.Request) -> Any:
        try:
            how = fields.choice("control_preprocess", preprocess, fields.CONTROL_PREPROCESSORS)
            size = side_length("width", width, limits), side_length("height", height, limits)
            if pad is None:
                raise InvalidRequest("control_image", "control_image: draw on the pad or upload a map first")
            raw, copies = await asyncio.to_thread(with_upload_bytes, {"control_image": pad})
            forget_temp_files(demo, copies)
            if raw["control_image"] is None:
                raise InvalidRequest("control_image", "control_image: draw on the pad or upload a map first")
            caller = request_caller(request, site.trusted)
            user = caller.key if caller is not None else None
            return await adapter.decoder.run(user, map_preview, raw["control_image"], how, *size)
        except InvalidRequest as exc:
            raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None

    return preview


# The page's inputs held by Generate's first step are hidden (``mode_panel.hold_mask``): a message about
# one is painted at the control a person sees beside it; every page refusal is also said under the prompt
# (a control in a folded panel shows nothing) and in the status line (``shown.REFUSED_JS``).
HELD_SAID_AT = {"mask": "mode", "control_image": "control"}


def make_validator(adapter: Adapter, *, ui: bool = False) -> Callable[..., Awaitable[list[dict[str, Any]]]]:
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
            # The pictures are decoded in the handler, off the loop: here only the other fields.
            raw = dict(zip(FIELDS, values))
            # The page's request as its handler reads it: only what its mode reads (the inpaint
            # mode's picture is the mask editor's; a picture left in a hidden box is not sent).
            gradio_checks(raw)
            validate(page_values(raw) if ui else raw, adapter.limits, pictures_later=True)
        except InvalidRequest as exc:
            adapter.metrics.jobs.labels("rejected").inc()  # answered here, it never reaches the adapter
            field = HELD_SAID_AT.get(exc.field, exc.field) if ui else exc.field
            bad = {FIELDS.index(field) if field in FIELDS else 0}
            if ui:  # said under the prompt too: the field's control may be in a folded panel
                bad.add(FIELDS.index("prompt"))
            return [gr.validate(i not in bad, str(exc) if i in bad else "") for i in range(len(values))]
        return [gr.validate(True, "") for _ in values]

    return introspected_once(check)


def _user_error(exc: Exception, request_id: str) -> gr.Error:
    """What a caller is told about a request that failed (called in the ``except`` block: it logs)."""
    if isinstance(exc, InvalidRequest):
        return gr.Error(str(exc), title="Invalid input", print_exception=False)
    if isinstance(exc, RetryLater):
        return gr.Error(str(exc), title="Please retry", print_exception=False)
    if isinstance(exc, ServingError):
        return gr.Error(str(exc), print_exception=False)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # Gradio's own writes on a full disk
        return gr.Error(str(StorageFull()), title="Please retry", print_exception=False)
    log.exception("request %s failed", request_id)
    return gr.Error(f"Internal error (request id {request_id}). Please try again.", print_exception=False)

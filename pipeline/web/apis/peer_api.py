"""What AUTOMATIC1111's ``/sdapi/v1`` and OpenAI's ``/v1/images`` routes share (``sdapi``, ``openai_images``).

Both enter the same line as the page: ``Adapter.run``, with the caller's identity from the front
door (``identity.caller_of``, the login included), so validation, the fair share, the waiting cap,
the quota, the cost budget, the job time limit and the gate are the page's. Nothing here decides
who goes first.

- ``PeerJobs``: each identity's HTTP API jobs in flight, what A1111's ``progress`` reports and
  ``interrupt`` stops: the caller's own, never anyone else's.
- ``run_request``: one request through ``Adapter.run`` to its end, its progress kept in the book; a
  client that disconnects stops its job at the next step (``watch_disconnect``).
- ``http_error``: a ``ServingError`` as an HTTP status, message and ``Retry-After``.

Owner: the event loop (the routes' handlers); nothing here blocks it: a picture's bytes are read
and encoded in the adapter's pool or ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import dataclasses
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Mapping

import orjson
from fastapi import Request

from ...errors import (
    Cancelled,
    InvalidRequest,
    JobTimedOut,
    OutOfMemory,
    QuotaExceeded,
    RetryLater,
    ServingError,
    StorageFull,
    TooManyPictures,
    TooManyWaiting,
)
from ...protocol import Output
from ...request import new_request_id
from ...serving.base import Adapter
from ...uploads import MAX_UPLOAD_BYTES
from ..door import asgi
from ..door.identity import Caller, TrustedProxies, caller_of
from ..door.login import LOGIN_STATE
from ..door.upload_route import UploadBook, UploadRefused

B64_SLICE = 1 << 20  # base64 characters decoded in one call (a multiple of 4)


@dataclass
class PeerJob:
    """One HTTP API job in flight: what ``progress`` shows of it."""

    request_id: str
    started: float
    ahead: int | None = None
    step: int = 0
    total: int = 0
    eta_seconds: float | None = None
    preview: bytes | None = None  # the latest live preview (JPEG), when the job asked for previews
    interrupted: bool = False


@dataclass
class PeerJobs:
    """Each identity's HTTP API jobs in flight (event loop only)."""

    by_user: dict[str, dict[str, PeerJob]] = field(default_factory=dict)

    def of(self, user: str) -> list[PeerJob]:
        return sorted(self.by_user.get(user, {}).values(), key=lambda job: job.started)

    def interrupt(self, user: str, abort: Callable[[str, str], bool]) -> int:
        """Stop ``user``'s own jobs at their next step, through the adapter's ``abort``; how many."""
        jobs = self.of(user)
        for job in jobs:
            job.interrupted = True  # its end is an interrupt, not a failure (``run_request``)
            abort(job.request_id, "interrupt")
        return len(jobs)

    @contextlib.contextmanager
    def tracking(self, user: str, job: PeerJob) -> Any:
        self.by_user.setdefault(user, {})[job.request_id] = job
        try:
            yield job
        finally:
            jobs = self.by_user.get(user, {})
            jobs.pop(job.request_id, None)
            if not jobs:
                self.by_user.pop(user, None)


def http_caller(request: Request) -> Caller:
    """Who is asking: the front door's ``Caller`` with its ``--auth`` login; a request that did not
    pass the door (a test's direct call) is resolved the same way from its peer."""
    state = request.scope.get("state", {})
    caller = state.get("t2i_caller")
    if not isinstance(caller, Caller):
        caller = caller_of(asgi.peer(dict(request.scope)), list(request.headers.items()), TrustedProxies())
    login = state.get(LOGIN_STATE)
    return dataclasses.replace(caller, login=login) if login else caller


@contextlib.asynccontextmanager
async def watch_disconnect(request: Request, on_gone: Callable[[], object]) -> AsyncIterator[None]:
    """Call ``on_gone`` when the client of a request whose body has been read goes away (the ASGI
    server's ``http.disconnect``), so its job stops at the next step rather than run for no one."""

    async def listen() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                on_gone()
                return

    task = asyncio.get_running_loop().create_task(listen(), name="api-disconnect-watch")
    try:
        yield
    finally:
        task.cancel()


@dataclass
class Ended:
    """A job's end: its images (``done``), or it was interrupted by its own caller."""

    done: Output | None
    interrupted: bool = False
    steps_done: int = 0


async def run_request(
    adapter: Adapter,
    raw: Mapping[str, Any],
    caller: Caller,
    jobs: PeerJobs,
    request: Request,
    on_step: Callable[[Output], Any] | None = None,
) -> Ended:
    """``raw`` through ``adapter.run`` as ``caller`` (the page's line, the page's rules) to its end.
    Its client's disconnect and its identity's interrupt stop it through the adapter's ``abort``.

    Raises the ``ServingError`` that ended it, except an interrupt by its own caller (``Ended``)."""
    user = caller.key
    job = PeerJob(new_request_id(), time.time())
    with jobs.tracking(user, job):
        events = adapter.run(raw, request_id=job.request_id, user=user, account=caller.account)
        try:
            async with watch_disconnect(request, lambda: adapter.abort(job.request_id, "disconnect")):
                return await _relay(events, job, on_step)
        except Cancelled as exc:
            if job.interrupted:
                return Ended(None, interrupted=True, steps_done=exc.steps_done or job.step)
            raise


async def _relay(events: AsyncGenerator[Output, None], job: PeerJob, on_step: Callable[[Output], Any] | None) -> Ended:
    """A job's events into its ``PeerJob`` (what ``progress`` shows) until its end."""
    async with contextlib.aclosing(events):
        async for event in events:
            if event.kind == "waiting":
                job.ahead, job.eta_seconds = event.ahead, event.eta_seconds
            elif event.kind == "step":
                job.ahead, job.step, job.total, job.eta_seconds = 0, event.step, event.total, event.eta_seconds
                if event.preview is not None:
                    job.preview = event.preview.data
                if on_step is not None:
                    await on_step(event)
            else:
                return Ended(event)
    raise Cancelled("the request ended without its images")


def http_error(exc: BaseException) -> tuple[int, str, float]:
    """(status, message, Retry-After seconds or 0) for an error that ended a request."""
    if isinstance(exc, InvalidRequest):
        return 422, str(exc), 0.0
    if isinstance(exc, QuotaExceeded):
        return 429, str(exc), exc.retry_after
    if isinstance(exc, TooManyPictures):
        return 429, str(exc), exc.retry_after
    if isinstance(exc, TooManyWaiting):
        return 429, str(exc), 5.0
    if isinstance(exc, StorageFull):
        return 507, str(exc), 60.0
    if isinstance(exc, RetryLater):
        return 503, str(exc), 5.0
    if isinstance(exc, JobTimedOut):
        return 504, str(exc), 0.0
    if isinstance(exc, OutOfMemory):
        return 507, str(exc), 0.0
    if isinstance(exc, Cancelled):
        return 499, "The request was cancelled.", 0.0
    if isinstance(exc, ServingError) and exc.user_visible:
        return 500, str(exc), 0.0
    return 500, "The server failed on this request.", 0.0


def retry_headers(seconds: float) -> dict[str, str] | None:
    return {"retry-after": str(int(seconds) + 1)} if seconds else None


def b64_bytes(value: Any, field_name: str) -> bytes:
    """An image sent as base64 (A1111: with or without a ``data:image/...;base64,`` prefix), its bytes.

    A URL or a path is refused by name: nothing the server would fetch or read."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(field_name, f"{field_name} must be a base64-encoded PNG, JPEG or WebP image")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    if len(text) > (MAX_UPLOAD_BYTES * 4) // 3 + 8:
        raise InvalidRequest(field_name, f"{field_name}: the image is over {MAX_UPLOAD_BYTES // 2**20} MiB")
    if text.lstrip()[:8].lower().startswith(("http:", "https:", "file:", "ftp:")):  # no copy of the whole text
        raise InvalidRequest(field_name, f"{field_name} must be the image's bytes in base64, not a URL or a path")
    try:
        if len(text) <= B64_SLICE:
            return base64.b64decode(text, validate=False)
        # In slices, so no one C call holds the GIL for a whole picture (27 MiB of text: ~40 ms):
        # the event loop gets it between them. Whitespace goes first so every slice is whole quads.
        if len(text.split(maxsplit=1)) > 1:  # whitespace (one scan; none in what clients send)
            text = "".join(text.split())
        return b"".join(base64.b64decode(text[i : i + B64_SLICE], validate=False)
                        for i in range(0, len(text), B64_SLICE))  # fmt: skip
    except (binascii.Error, ValueError):
        raise InvalidRequest(field_name, f"{field_name} is not valid base64") from None


def charge_pictures(uploads: UploadBook | None, caller: Caller, raw: Mapping[str, Any], field: str) -> None:
    """The pictures of ``raw`` (sent inline: base64 or multipart) counted against the caller's uploads
    a minute (``UploadBook.charge``), before any is decoded: ``TooManyPictures`` past the rate."""
    pictures = sum(1 for name in ("image", "mask", "control_image") if raw.get(name) is not None)
    if uploads is None or not pictures:
        return
    try:
        uploads.charge(caller.key, pictures, field)
    except UploadRefused as exc:
        raise TooManyPictures(str(exc), exc.retry_after) from None


def read_pngs(paths: tuple[Path, ...]) -> list[bytes]:
    """The result's PNG files as written (with their ``parameters`` text): run off the loop."""
    return [path.read_bytes() for path in paths]


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (the route's body cap is the connection's: ``httplimits``), its depth
    checked before any parser walks it (orjson crashes the process on 200,000 ``[``) and both done
    off the event loop when it is large (``asgi.sized``: one body at a time)."""
    body = await request.body()
    if await asgi.sized(asgi.too_deep, body):
        raise InvalidRequest("body", f"the request body nests deeper than {asgi.MAX_JSON_DEPTH} levels")
    try:
        parsed = await asgi.sized(_object, body)
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest("body", "the request body must be a JSON object") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("body", "the request body must be a JSON object")
    return parsed


LONG_STRING = 64 * 1024  # a string this long is cut out of a body before the parse (``_object``)


def _object(body: bytes) -> Any:
    """``body`` parsed, its long strings (the pictures' base64) cut out first and put back after:
    orjson holds the GIL for a whole parse (about 100 ms for 51 MiB), the event loop with it; the
    strings are found with C-speed ``find`` calls, each a short hold, and only the small rest is parsed."""
    if not body.strip():
        return {}
    if len(body) <= LONG_STRING:
        return orjson.loads(body)
    mark = secrets.token_hex(8)  # the placeholders' prefix: no client can write one
    skeleton, strings = _cut_long_strings(body, mark)
    parsed = orjson.loads(skeleton)
    return _put_back(parsed, strings, mark) if strings else parsed


def _cut_long_strings(body: bytes, mark: str) -> tuple[bytes, list[str]]:
    """``body`` with each string of over ``LONG_STRING`` bytes replaced by ``"MARK:N"`` (N: its index in
    the list), and those strings, decoded. Linear: each quote is found once, and the backslashes
    before it counted once (the runs between quotes do not overlap)."""
    parts: list[bytes] = []
    strings: list[str] = []
    view = memoryview(body)
    at = start = 0
    while (opening := body.find(b'"', at)) != -1:
        closing = opening
        while True:
            closing = body.find(b'"', closing + 1)
            if closing == -1:  # an unclosed string: orjson says so on the whole body
                return body, []
            slashes = 0
            while body[closing - 1 - slashes] == 0x5C:  # a backslash
                slashes += 1
            if slashes % 2 == 0:
                break
        if closing - opening - 1 > LONG_STRING:  # one pass over it: no copy of the slice first
            escaped = body.find(b"\\", opening, closing) != -1
            strings.append(orjson.loads(view[opening : closing + 1]) if escaped else _text(view[opening + 1 : closing]))
            parts += [body[start:opening], f'"{mark}:{len(strings) - 1}"'.encode()]
            start = closing + 1
        at = closing + 1
    return b"".join([*parts, body[start:]]), strings


def _text(data: memoryview, slice_bytes: int = 1 << 20) -> str:
    """UTF-8 ``data`` as text, a megabyte a call (the GIL is free between calls); a multi-byte
    character cut by a slice boundary is decoded whole by an incremental decoder."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts = [decoder.decode(data[i : i + slice_bytes]) for i in range(0, len(data), slice_bytes)]
    return "".join([*parts, decoder.decode(b"", final=True)])


def _put_back(value: Any, strings: list[str], mark: str) -> Any:
    if isinstance(value, str) and value.startswith(mark + ":"):
        return strings[int(value[len(mark) + 1 :])]
    if isinstance(value, list):
        return [_put_back(v, strings, mark) for v in value]
    if isinstance(value, dict):
        return {_put_back(k, strings, mark): _put_back(v, strings, mark) for k, v in value.items()}
    return value

"""Small ASGI helpers for the front door: the peer, headers and cookies, bodies read under a cap and replayed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from functools import partial
from http.cookies import SimpleCookie
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import parse_qs

import numpy as np
import orjson

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")


def peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def is_loopback(scope: Scope) -> bool:
    return peer(scope) in ("127.0.0.1", "::1")


def header(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k == name), "")


def set_header(scope: Scope, name: str, value: str) -> None:
    key = name.encode()
    scope["headers"] = [(k, v) for k, v in scope.get("headers", []) if k != key] + [(key, value.encode("latin-1"))]


def cookies(headers: list[tuple[str, str]]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for k, v in headers:
        if k == "cookie":
            try:
                jar.load(v)
            except Exception:  # a malformed cookie header logs nobody in
                continue
    return {k: m.value for k, m in jar.items()}


def query_session(scope: Scope) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
    return values[0] if values else None


def with_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


async def read_body(receive: Receive, cap: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# The shape of the front door's own refusals for the request in hand (``frontdoor`` sets it per
# request: each request runs in a task of its own): "detail" (Gradio's and FastAPI's), or "openai"
# on OpenAI's routes, whose clients read ``{"error": {"message", "type", "param", "code"}}``.
ERROR_SHAPE: contextvars.ContextVar[str] = contextvars.ContextVar("error_shape", default="detail")
OPENAI_ERROR_TYPES = {401: "invalid_request_error", 403: "invalid_request_error", 404: "invalid_request_error",
                      413: "invalid_request_error", 429: "rate_limit_exceeded"}  # fmt: skip


def error_payload(status: int, detail: Any, shape: str | None = None) -> bytes:
    """A refusal's JSON body, in the request's shape (``ERROR_SHAPE``)."""
    if (shape or ERROR_SHAPE.get()) == "openai":
        kind = OPENAI_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        return orjson.dumps({"error": {"message": str(detail), "type": kind, "param": None, "code": None}})
    return orjson.dumps({"detail": detail})


async def json(send: Send, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
    body = error_payload(status, detail)
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def body(send: Send, status: int, data: bytes, content_type: str, head_only: bool = False) -> None:
    """A whole response from bytes in memory (HEAD: the headers only)."""
    head = [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode()),
            (b"cache-control", b"private, max-age=3600")]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": b"" if head_only else data})


async def close_websocket(send: Send) -> None:
    await send({"type": "websocket.close", "code": 1008})


MAX_JSON_DEPTH = 64  # arrays and objects inside each other, in any JSON body the front door reads
ON_LOOP_BYTES = 64 * 1024  # a body up to this size is checked and parsed on the event loop; a larger one off it
_OPENERS = np.zeros(256, dtype=np.int8)
_OPENERS[[ord("["), ord("{")]] = 1
_OPENERS[[ord("]"), ord("}")]] = -1


def outside_strings(body: bytes) -> bytes:
    """``body`` without its JSON strings, in a few C-speed passes, linear in its length whatever it holds
    (an unclosed string, a run of escapes). Escapes pair left to right as JSON reads them: ``\\\\`` is
    one backslash, so after dropping those pairs every ``\\"`` left is an escaped quote; the quotes
    that remain open and close the strings, and what lies between pairs of them is outside."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[0::2])


# One thread for the work a large body costs (its depth check, its parse, its base64 pictures): each
# of those is one C call that holds the GIL for as long as the body is long (orjson on 51 MiB: about
# 50 ms). On one thread they follow each other, so the event loop waits behind one of them at a time,
# never behind six at once. (It keeps its CPU priority: a thread that holds the GIL must not be
# the one the OS puts last.) The pictures' pixels are decoded elsewhere (``serving.decoding``).
_BIG_BODIES = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="big-body")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the ``big-body`` thread."""
    return await asyncio.get_running_loop().run_in_executor(_BIG_BODIES, partial(fn, *args))


async def sized(fn: Callable[..., T], body: bytes, *args: Any) -> T:
    """``fn(body, *args)``: on the event loop for a body of at most ``ON_LOOP_BYTES``, else on the
    ``big-body`` thread (a check or a parse linear in a body of megabytes is still milliseconds the
    loop must not hold)."""
    if len(body) <= ON_LOOP_BYTES:
        return fn(body, *args)
    return await off_loop(fn, body, *args)


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``body`` nests deeper than ``limit``, found without a parser (whose recursion
    a body of 200,000 ``[`` overflows): the strings out, then the running depth of the brackets
    (numpy's cumulative sum: linear, C-speed). A body with fewer brackets than ``limit`` takes none."""
    if _brackets(body) <= limit:
        return False
    steps = _OPENERS[np.frombuffer(outside_strings(body), dtype=np.uint8)]
    return bool(steps.size) and int(np.cumsum(steps, dtype=np.int32).max()) > limit


def _brackets(body: bytes, slice_bytes: int = 1 << 20) -> int:
    """How many ``[`` and ``{`` ``body`` holds, counted a megabyte at a time: no one call holds the GIL
    for a body of 51 MiB (about 60 ms), so the event loop gets it between slices."""
    return sum(
        part.count(b"[") + part.count(b"{")
        for part in (body[i : i + slice_bytes] for i in range(0, len(body), slice_bytes))
    )


def status_recorder(send: Send, on_body: Callable[[int, bytes], None]) -> Send:
    """``send``, telling ``on_body`` the status and the whole body of a small response before it goes out."""
    status, chunks = 0, []

    async def recording(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                on_body(status, b"".join(chunks))
        await send(message)

    return recording

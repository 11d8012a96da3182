"""HTTP limits at the connection, below Gradio and the front door: what uvicorn itself does not bound.

uvicorn (0.55, httptools) waits for a request's headers and body as long as a client cares to
send them, takes any header size and body size, and any number of connections from one address.
``limited_protocol`` makes its httptools protocol:

- answer 408 and close when a request's headers take over ``header_timeout`` seconds from its
  first byte (or from the connection's start), or its body over ``body_timeout`` from the headers;
- answer 431 to headers over ``max_header_bytes`` and 413 to a body over ``max_body_bytes`` (by
  ``Content-Length`` at once, else as the bytes arrive), so no 100 MB body is ever read;
- answer 429 and close a connection past ``connections_per_address`` open from one peer address.
  A trusted proxy's connections carry many clients, so they are not counted here: behind a proxy
  the front door caps each forwarded client's open requests instead.

Owner: the server's event loop (protocol callbacks run there); ``open_per_address`` is its alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .asgi import error_payload
from .identity import TrustedProxies


@dataclass
class ConnectionLimits:
    trusted: TrustedProxies
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 2**20
    body_caps: dict[str, int] = field(default_factory=dict)  # a path's own body cap (the upload route's)
    connections_per_address: int = 32
    open_per_address: dict[str, int] = field(default_factory=dict)
    refused: dict[int, int] = field(default_factory=dict)  # status -> connections answered so (for tests, logs)


def limited_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol under ``limits`` (pass as ``uvicorn.Config(http=...)``)."""

    class Limited(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            self._counted: str | None = None
            self._header_bytes = 0
            self._body_bytes = 0
            self._path = ""
            self._cap = limits.max_body_bytes  # this request's: its path's own, else the default
            self._refused = False  # answered and closing: the parser's later callbacks do nothing

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            if address and not limits.trusted.trusts(address):
                n = limits.open_per_address.get(address, 0)
                if n >= limits.connections_per_address:
                    self._refuse(429, b"Too many connections from your address.")
                    return
                limits.open_per_address[address] = n + 1
                self._counted = address
            self._arm(limits.header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted is not None:
                n = limits.open_per_address.get(self._counted, 1) - 1
                if n > 0:
                    limits.open_per_address[self._counted] = n
                else:
                    limits.open_per_address.pop(self._counted, None)
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def on_message_begin(self) -> None:
            if self._refused:
                return
            super().on_message_begin()
            self._header_bytes = self._body_bytes = 0
            if self._timer is None:  # a keep-alive connection's next request: its headers' clock starts
                self._arm(limits.header_timeout)

        def on_url(self, url: bytes) -> None:
            if self._refused:
                return
            self._header_bytes += len(url)
            if self._header_bytes > limits.max_header_bytes:
                return self._refuse(431, b"Request headers too large.")
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._refused:
                return
            self._header_bytes += len(name) + len(value)
            if self._header_bytes > limits.max_header_bytes:
                return self._refuse(431, b"Request headers too large.")
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            path = bytes(getattr(self, "url", b"")).split(b"?", 1)[0].decode("latin-1")
            self._path = path
            self._cap = limits.body_caps.get(path, limits.max_body_bytes)
            length = dict(self.headers).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self._cap:
                return self._refuse(413, b"Request body too large.")
            super().on_headers_complete()
            if (length.isdigit() and int(length) > 0) or b"chunked" in dict(self.headers).get(
                b"transfer-encoding", b""
            ):
                self._arm(limits.body_timeout)

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            self._body_bytes += len(body)
            if self._body_bytes > self._cap:
                return self._refuse(413, b"Request body too large.")
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            super().on_message_complete()

        # -- helpers -------------------------------------------------------------------------
        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            self._refuse(408, b"Request timed out: send the request faster.")

        def _refuse(self, status: int, text: bytes) -> None:
            """Answer ``status`` (unless a response has begun) and close the connection."""
            limits.refused[status] = limits.refused.get(status, 0) + 1
            self._refused = True
            self._disarm()
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the app, if it runs, reads a disconnect
                cycle.message_event.set()
            if cycle is None or not cycle.response_started:
                reason = {408: b"Request Timeout", 413: b"Content Too Large", 429: b"Too Many Requests"}.get(
                    status, b"Request Header Fields Too Large"
                )
                kind = b"text/plain"
                if self._path.startswith("/v1/"):  # OpenAI's routes: its clients read its shape
                    kind, text = b"application/json", error_payload(status, text.decode(), "openai")
                head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                self.transport.write(head % (status, reason, kind, len(text)) + text)
            self.transport.close()

    return Limited

"""The front door: one ASGI middleware in front of every Gradio route, for clients that send anything.

In order, for each HTTP request (``FrontDoor.__call__``):

1. who: ``identity.caller_of`` (the TCP peer, through ``--trusted-proxies``), kept in the request's
   state for the handler; a client-sent seal of an MCP caller is dropped unless this process made it;
2. the route: only the routes this app uses (``ROUTES``); the rest of Gradio's (``/monitoring``,
   ``/gradio_api/process_recording``, ``proxy=``, ``/run``, ``/stream``, ``/component_server``,
   ``/vibe-*``, ...) are 404, and ``file=`` serves only this app's own files, never a URL;
3. requests open at once per identity (``--max-connections-per-address``; long streams count);
4. the login: under ``--auth`` a valid ``Authorization: Basic`` or ``Bearer user:password`` is
   turned into Gradio's login cookie, and the MCP routes (which Gradio mounts outside its login
   check) need a login like every other API route;
5. sessions: a session hash belongs to the identity that used it first; each identity may keep
   ``--max-sessions-per-user`` open (``admission.SessionBook``);
6. joins (``/queue/join``, ``/call/generate``), logins and MCP calls take a token from the
   identity's bucket (``--rate-limit``): 429 with ``Retry-After`` past it;
7. a join's body (at most ``--max-body-kb``) is checked by ``inputs.InputPolicy`` and handed on;
8. a GET of a live preview the server has just written is answered from memory
   (``outputs.RECENT_PREVIEWS``, to the login's caller under ``--auth``); any other file is Gradio's.

Owner: the event loop (the server's); the books it keeps are only touched there.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson

from . import asgi
from .admission import InFlight, SessionBook, TokenBucket
from .asgi import App, Message, Receive, Scope, Send
from .gradio_internals import cookie_user, login_cookie
from .httplimits import ConnectionLimits
from .identity import SEAL_HEADER, Caller, TrustedProxies, caller_of, seal, unseal
from .inputs import InputPolicy, Refused
from .outputs import RECENT_PREVIEWS
from .site import LiveCalls

log = logging.getLogger(__name__)


LOGIN_REQUIRED = ("mcp",)  # route kinds the door itself refuses without a login (Gradio mounts MCP outside its own)
INTERNAL_HEADER = "x-t2i-internal"  # Gradio's MCP server's own client, calling back over loopback
API = "/gradio_api"
# (methods, path pattern, kind). Everything else is 404. Kinds say what more the door does.
ROUTES: tuple[tuple[frozenset[str], re.Pattern[str], str], ...] = tuple(
    (frozenset(methods.split()), re.compile(pattern), kind)
    for methods, pattern, kind in (
        ("GET HEAD", r"/|/config/?|/favicon\.ico|/robots\.txt|/manifest\.json|/theme\.css|/pwa_icon(/\d+)?", "page"),
        ("GET HEAD", r"/(assets|static|svelte)/.*", "page"),
        ("GET HEAD", rf"{API}/(info|app_id|user|login_check|token|startup-events|theme\.css|queue/status)/?", "page"),
        ("GET HEAD", r"/health|/metrics", "service"),
        ("GET HEAD", rf"{API}/file(=|/).*", "file"),
        ("GET", rf"{API}/heartbeat/(?P<session>[^/]*)", "heartbeat"),
        ("GET", rf"{API}/queue/data", "stream"),
        ("GET", rf"{API}/call/(v2/)?generate/[^/]+", "stream"),
        ("POST", rf"{API}/queue/join", "join"),
        ("POST", rf"{API}/call/(v2/)?(?P<api>generate)/?", "call"),
        ("POST", rf"{API}/cancel", "cancel"),
        ("POST", rf"{API}/reset/?", "small"),
        ("POST", rf"{API}/upload", "service"),  # the app's own route answers 403: no uploads
        ("POST", r"/login/?", "login"),
        ("GET", r"/logout/?", "page"),
        ("GET POST DELETE", rf"{API}/mcp(/.*)?", "mcp"),
    )
)


@dataclass
class DoorLimits:
    max_body_bytes: int = 2**20
    joins_per_second: float = 4.0
    join_burst: float = 40.0
    sessions_per_identity: int = 16
    requests_per_identity: int = 32


class FrontDoor:
    """The middleware (see the module doc). ``Middleware(FrontDoor, door=DoorConfig(...))``."""

    def __init__(self, app: App, door: DoorConfig) -> None:
        self.app = app
        self.d = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                return await asgi.close_websocket(send)
            return await self.app(scope, receive, send)
        d, path, method = self.d, scope.get("path", ""), scope.get("method", "GET")
        headers = _drop_unsealed(scope)
        internal = asgi.is_loopback(scope) and hmac.compare_digest(
            asgi.header(headers, INTERNAL_HEADER).encode("latin-1"), d.internal_secret.encode()
        )
        caller = caller_of(asgi.peer(scope), headers, d.trusted)  # 1. who
        scope.setdefault("state", {})["t2i_caller"] = caller
        route = _route(method, path)  # 2. the route
        if route is None:
            log.info("refused %s %s from %s: not a route of this app", method, path[:200], caller.key)
            return await asgi.json(send, 404, "Not Found")
        kind, match = route
        if kind == "file" and _url_like(path):
            return await asgi.json(send, 403, "This app serves only its own files.")
        if kind == "service" or internal:
            return await self._logged_in(scope, receive, send, kind, caller, internal, headers)
        if not d.in_flight.enter(caller.key):  # 3. requests open at once
            return await asgi.json(send, 429, "Too many open requests from your address; close some tabs or wait.")
        try:
            await self._logged_in(scope, receive, send, kind, caller, internal, headers, match)
        finally:
            d.in_flight.leave(caller.key)

    async def _logged_in(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: str,
        caller: Caller,
        internal: bool,
        headers: list[tuple[str, str]],
        match: re.Match[str] | None = None,
    ) -> None:
        d = self.d
        user = None
        if d.auth is not None:  # 4. the login
            user = self._bridge_login(scope, headers, internal)
            if user is None and kind in LOGIN_REQUIRED:
                return await asgi.json(send, 401, "Login required.", {"www-authenticate": 'Basic realm="mcp"'})
        if kind in ("join", "call", "login", "mcp") and not internal:  # 6. the rate of joins
            wait = d.buckets.take(caller.key)
            if wait > 0:
                return await asgi.json(
                    send, 429, "Too many requests from your address; slow down.", {"retry-after": str(int(wait) + 1)}
                )
        if kind == "mcp":
            return await self._mcp(scope, receive, send, caller)
        if kind in ("heartbeat", "stream") and not internal:  # 5. sessions
            session = match["session"] if kind == "heartbeat" and match else asgi.query_session(scope)
            if session and await self._claim(send, caller, session):
                return None
            if kind == "heartbeat" and session:
                try:
                    return await self.app(scope, receive, send)
                finally:
                    d.sessions.release(caller.key, session)
            return await self.app(scope, receive, send)
        if kind in ("join", "call", "cancel", "small", "login"):
            return await self._with_body(scope, receive, send, kind, caller, internal)
        if kind == "file" and (d.auth is None or user is not None):  # 8. a live preview, from memory
            preview = RECENT_PREVIEWS.get(unquote(scope["path"].split("file=", 1)[-1]))
            if preview is not None:
                return await asgi.body(send, 200, preview, "image/jpeg", scope["method"] == "HEAD")
        return await self.app(scope, receive, send)

    async def _with_body(
        self, scope: Scope, receive: Receive, send: Send, kind: str, caller: Caller, internal: bool
    ) -> None:
        """7. Read the body (at most the cap), check it, and hand it on."""
        body = await asgi.read_body(receive, self.d.max_body_bytes)
        if body is None:
            return await asgi.json(send, 413, f"The request body is over the limit of {self.d.max_body_bytes} bytes.")
        if kind in ("join", "call", "cancel"):
            try:
                parsed = _loads(body)
                body = self._checked(kind, parsed, scope) or body
            except ValueError:
                return await asgi.json(send, 400, "The request body must be JSON.")
            except Refused as refused:
                return await asgi.json(send, refused.status, refused.detail)
            session = parsed.get("session_hash") if isinstance(parsed, dict) else None
            if session and not internal and await self._claim(send, caller, str(session)):
                return None
        await self.app(asgi.with_length(scope, len(body)), asgi.replay(body, receive), send)

    def _checked(self, kind: str, parsed: Any, scope: Scope) -> bytes | None:
        """Refuse a bad body (``Refused``); the body to hand on if it had to change, else None."""
        policy = self.d.policy
        if kind == "join":
            _event, cleaned = policy.check_join(parsed)
            # NaN and Infinity stay as sent (Python's JSON): the validator names the field they are in.
            return json.dumps(cleaned).encode() if cleaned != parsed else None
        if kind == "call":
            event = policy.by_api_name.get("generate")
            if event is None or not isinstance(parsed, dict):
                raise Refused(404, "No such event.")
            data = parsed.get("data") if "/call/v2/" not in scope["path"] else None
            if data is None:  # v2: one JSON member per parameter
                data = [parsed.get(f.name) for f in event.fields]
                if set(parsed) - {f.name for f in event.fields}:
                    raise Refused(
                        400, f"unknown parameters; the parameters are {', '.join(f.name for f in event.fields)}"
                    )
            policy.check_data(event, data)
            return None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("session_hash"), str):
            raise Refused(400, "A cancel names session_hash, fn_index and event_id.")
        return None

    async def _claim(self, send: Send, caller: Caller, session: str) -> bool:
        """Whether the session was refused to ``caller`` (the refusal has been answered then)."""
        why = self.d.sessions.claim(caller.key, session)
        if why is None:
            return False
        if why == "foreign":
            await asgi.json(send, 403, "This session belongs to someone else.")
        else:
            n = self.d.sessions.per_identity
            await asgi.json(send, 429, f"Too many open sessions from your address (at most {n}); close a tab or wait.")
        return True

    def _bridge_login(self, scope: Scope, headers: list[tuple[str, str]], internal: bool) -> str | None:
        """The request's login (Gradio's cookie, or Basic/Bearer turned into it); None: not logged in."""
        app = scope.get("app")
        if app is None or not hasattr(app, "tokens"):
            return None
        cookies = asgi.cookies(headers)
        user = cookie_user(app, cookies)
        if user is None:
            user = self.d.check_authorization(asgi.header(headers, "authorization"))
            if user is None and internal:
                user = "mcp"  # Gradio's MCP server's own client: the tool call it makes carries the caller's login
            if user is not None:
                name, token = login_cookie(app, user)
                asgi.set_header(
                    scope, "cookie", "; ".join([*(f"{k}={v}" for k, v in cookies.items()), f"{name}={token}"])
                )
        return user

    async def _mcp(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """An MCP request: seal who the caller is into the call Gradio makes back, and watch it stay.

        A streamable-HTTP POST carries its tool call's answer, so the call lasts as long as the
        request: the job of a call whose caller went away is stopped. (The older SSE transport's
        POST only hands the call over; such a call is not followed.)
        """
        streamed = scope["method"] == "POST" and scope["path"].rstrip("/") in (f"{API}/mcp", f"{API}/mcp/http")
        call = secrets.token_hex(8) if streamed else ""
        asgi.set_header(scope, SEAL_HEADER, seal(caller.address, call))
        calls = self.d.calls.open
        if call:
            calls.add(call)

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                calls.discard(call)
            return message

        try:
            await self.app(scope, watched, send)
        finally:
            calls.discard(call)


@dataclass
class DoorConfig:
    """What the front door knows: the policy, the books, the login and the trusted proxies."""

    policy: InputPolicy
    trusted: TrustedProxies
    limits: DoorLimits
    auth: tuple[str, str] | None = None
    internal_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    calls: LiveCalls = field(default_factory=LiveCalls)
    connections: ConnectionLimits | None = None  # the connection limits below the door (their counts)

    buckets: TokenBucket = field(init=False)
    sessions: SessionBook = field(init=False)
    in_flight: InFlight = field(init=False)

    def __post_init__(self) -> None:
        lim = self.limits
        self.buckets = TokenBucket(lim.joins_per_second, lim.join_burst)
        self.sessions = SessionBook(lim.sessions_per_identity)
        self.in_flight = InFlight(lim.requests_per_identity)

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    def check_authorization(self, header: str) -> str | None:
        """The user an ``Authorization`` header logs in (Basic, or Bearer ``user:password``)."""
        if self.auth is None or not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value.strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
        elif scheme.lower() != "bearer":
            return None
        user, _, password = value.strip().partition(":")
        expected = ":".join(self.auth).encode()
        return user if hmac.compare_digest(f"{user}:{password}".encode(), expected) else None


def _loads(body: bytes) -> Any:
    """A JSON body: orjson, else Python's parser, which also reads the NaN and Infinity Gradio accepts."""
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _route(method: str, path: str) -> tuple[str, re.Match[str] | None] | None:
    for methods, pattern, kind in ROUTES:
        if method in methods and (match := pattern.fullmatch(path)) is not None:
            return kind, match
    return None


def _url_like(path: str) -> bool:
    rest = unquote(path.split("file=", 1)[1] if "file=" in path else path.split("/file/", 1)[-1])
    return "://" in rest or rest.startswith("//") or rest.lower().startswith(("http:", "https:", "data:", "ftp:"))


def _drop_unsealed(scope: Scope) -> list[tuple[str, str]]:
    """The request's headers as text; a seal header survives only from loopback and only if it is ours."""
    raw = scope.get("headers") or []
    keep = asgi.is_loopback(scope)
    kept = [(k, v) for k, v in raw if k != b"x-t2i-caller" or (keep and unseal(v.decode("latin-1")) is not None)]
    if len(kept) != len(raw):
        scope["headers"] = kept
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in kept]

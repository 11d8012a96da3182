"""The front door: one ASGI middleware in front of every Gradio route, for clients that send anything.

In order, for each HTTP request (``FrontDoor.__call__``):

1. who: ``identity.caller_of`` (the TCP peer, through ``--trusted-proxies``), kept in the request's
   state for the handler; a client-sent seal of an MCP caller is dropped unless this process made it;
2. the route: only the routes this app uses (``ROUTES``); the rest of Gradio's (``/monitoring``,
   ``/gradio_api/process_recording``, ``proxy=``, ``/run``, ``/stream``, ``/component_server``,
   ``/vibe-*``, ...) are 404, and ``file=`` serves only this app's own files, never a URL;
3. requests open at once per identity (``--max-connections-per-address``; long streams count);
4. the login (``login.Login``): under ``--auth`` every route but the few a login page needs
   (``OPEN_UNDER_AUTH``) and ``/health`` needs a login, the heartbeat and the MCP routes (which
   Gradio mounts outside its login check) included. A valid ``Authorization: Basic`` or ``Bearer
   user:password`` is turned into Gradio's login cookie. Every failed check of a credential, on any
   route and in any header, the login form's included, takes from the identity's budget of failed
   logins; past it, 429 with ``Retry-After`` before anything is compared;
5. sessions: a session hash belongs to the identity that used it first; each identity may keep
   ``--max-sessions-per-user`` open (``admission.SessionBook``);
6. every write (each POST, and MCP) takes a token from the identity's bucket (``--rate-limit``):
   429 with ``Retry-After`` past it;
7. a JSON body (at most ``--max-body-kb``, nested at most ``asgi.MAX_JSON_DEPTH`` deep, else 400
   before any parser walks it; both found in time linear in the body, off the loop past
   ``asgi.ON_LOOP_BYTES``) is checked by ``inputs.InputPolicy`` and handed on;
8. an event belongs to the identity that created it (``admission.EventBook``): a read of its
   results by id (``/call/<api>/<event_id>``) or a cancel naming it answers only that identity;
9. a GET of a live preview the server has just written is answered from memory
   (``routes.RECENT_PREVIEWS``, to the login's caller under ``--auth``); any other file is Gradio's,
   a relative name read in Gradio's cache (the HTTP APIs' ``url`` answers: no disk path in them);
10. an image input of an event names only a file its caller uploaded (``upload_route.UploadBook``,
   checked by ``inputs.InputPolicy``): a URL, a server path, another identity's upload or one that
   another session named first is 422;
11. a large body (over ``LARGE_BODY``: pictures for the HTTP APIs, an upload) is read in its turn,
   one at a time per identity and two in all (``FrontDoor._large``).

An exception below the door is answered 500 and logged as one line, without the stack: no client
input writes a traceback into the log.

Owner: the event loop (the server's); the books it keeps are only touched there.
"""

from __future__ import annotations

import gc
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import orjson

from ... import allocator
from ..gradio_internals import cookie_user, login_cookie, upload_folder
from . import asgi
from .admission import EventBook, InFlight, LargeBodies, LiveCalls, SessionBook, TokenBucket
from .asgi import App, Message, Receive, Scope, Send
from .guards import API, JSON_BODIES, OPEN_UNDER_AUTH, not_a_file_of_ours, route_of, takes_a_token
from .httplimits import ConnectionLimits
from .identity import SEAL_HEADER, Caller, TrustedProxies, caller_of, seal, unseal
from .inputs import InputPolicy, Refused
from .login import LOGIN_STATE, Login, presents_credential
from .routes import RECENT_PREVIEWS
from .upload_route import NO_SESSION, UploadBook

log = logging.getLogger(__name__)

INTERNAL_HEADER = "x-t2i-internal"  # Gradio's MCP server's own client, calling back over loopback
LARGE_BODY = 2**20  # a body over this many bytes waits for its turn to be read (``FrontDoor._large``)


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
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._admit(scope, receive, watched)
        except Exception as exc:  # one line, no stack: a client must not be able to fill the log
            path = str(scope.get("path", ""))[:200]
            log.error("%s %s failed: %s: %.200s", scope.get("method"), path, type(exc).__name__, exc)
            if not started:
                await asgi.json(send, 500, "Internal error.")

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        d, path, method = self.d, scope.get("path", ""), scope.get("method", "GET")
        if path.startswith("/v1/"):  # OpenAI's routes: the door's refusals in OpenAI's error shape
            asgi.ERROR_SHAPE.set("openai")
        headers = _drop_unsealed(scope)
        internal = asgi.is_loopback(scope) and hmac.compare_digest(
            asgi.header(headers, INTERNAL_HEADER).encode("latin-1"), d.internal_secret.encode()
        )
        caller = caller_of(asgi.peer(scope), headers, d.trusted)  # 1. who
        scope.setdefault("state", {})["t2i_caller"] = caller
        route = route_of(method, path)  # 2. the route
        if route is None:
            log.info("refused %s %s from %s: not a route of this app", method, path[:200], caller.key)
            if path.startswith("/sdapi/"):  # AUTOMATIC1111's clients: the route they asked for, named
                return await asgi.json(send, 404, f"{method} {path[:100]}: this app does not have this "
                                       "AUTOMATIC1111 route (its /sdapi/v1 routes: docs/usage.md)")  # fmt: skip
            return await asgi.json(send, 404, "Not Found")
        kind, match = route
        if kind == "file" and not_a_file_of_ours(path):
            return await asgi.json(send, 403, "This app serves only its own files.")
        if kind in ("health", "metrics") or internal:
            return await self._guarded(scope, receive, send, kind, caller, internal, headers, match)
        if not d.in_flight.enter(caller.key):  # 3. requests open at once
            return await asgi.json(send, 429, "Too many open requests from your address; close some tabs or wait.")
        try:
            await self._guarded(scope, receive, send, kind, caller, internal, headers, match)
        finally:
            d.in_flight.leave(caller.key)

    async def _guarded(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: str,
        caller: Caller,
        internal: bool,
        headers: list[tuple[str, str]],
        match: re.Match[str] | None,
    ) -> None:
        d = self.d
        user = None
        if d.login.auth is not None:  # 4. the login
            wait, user = self._login(scope, headers, kind, caller, internal)
            if wait > 0:
                return await _too_many(send, wait, "Too many failed logins from your address; wait and try again.")
            if user is None and kind not in OPEN_UNDER_AUTH and kind != "metrics":
                return await asgi.json(send, 401, "Login required.", {"www-authenticate": 'Basic realm="app"'})
            if user is not None:  # the HTTP APIs' identity carries the login, as the page's does
                scope["state"][LOGIN_STATE] = user
        if takes_a_token(kind, scope["method"]) and not internal:  # 6. the rate of writes
            wait = d.buckets.take(caller.account)
            if wait > 0:
                return await _too_many(send, wait, "Too many requests from your address; slow down.")
        if kind in ("heartbeat", "stream") and not internal:  # 5. sessions; 8. an event's reader
            event = match["event"] if match and "event" in match.groupdict() else None
            if event is not None and not d.events.owned_by(event, caller.key):
                return await asgi.json(send, 404, "No such event.")
            session = match["session"] if kind == "heartbeat" and match else asgi.query_session(scope)
            if session and await self._claim(send, caller, session):
                return None
            if kind == "heartbeat" and session:
                try:
                    return await self.app(scope, receive, send)
                finally:
                    d.sessions.release(caller.key, session)
            return await self.app(scope, receive, send)
        if kind in JSON_BODIES or kind == "login":
            return await self._with_body(scope, receive, send, kind, caller, internal)
        if kind == "file" and (d.login.auth is None or user is not None):  # 9. a live preview, from memory
            preview = RECENT_PREVIEWS.get(unquote(scope["path"].split("file=", 1)[-1]))
            if preview is not None:
                return await asgi.body(send, 200, preview, "image/jpeg", scope["method"] == "HEAD")
        if kind == "file" and not _in_cache(scope):  # a name relative to the file route: Gradio's cache
            return await asgi.json(send, 404, "No such file.")
        if kind in ("peer", "upload") and scope["method"] == "POST" and declared_length(headers) > LARGE_BODY:  # 11.
            return await self._large(scope, receive, send, caller)
        return await self.app(scope, receive, send)

    async def _large(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """A body of over ``LARGE_BODY`` bytes (pictures for the HTTP APIs, an upload) is read only in
        its turn (``admission.LargeBodies``: one at a time per identity, two in all): while it waits,
        nothing reads its bytes, so TCP holds its sender back, and six senders of 51 MiB cost the
        server two bodies' receiving at a time, not six. Its turn ends with its last byte (or its
        client's leave), before its handler works on it. When it has been answered, the memory it
        took goes back to the kernel."""
        done = await self.d.large_bodies.take(caller.account)

        async def reading() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                done()
            return message

        try:
            await self.app(scope, reading, send)
        finally:
            done()
            await asgi.off_loop(_give_back)  # its megabytes back to the kernel

    def _login(
        self, scope: Scope, headers: list[tuple[str, str]], kind: str, caller: Caller, internal: bool
    ) -> tuple[float, str | None]:
        """(seconds to wait before any credential is compared, else 0; the request's login or None).

        Gradio's cookie logs in; else a Basic or Bearer credential, checked only outside backoff,
        and metered when it fails. ``/metrics`` takes the metrics token too (its route checks it
        again); the login form is metered by its answer (``_with_body``).
        """
        login, meter, header = self.d.login, self.d.login.meter, asgi.header(headers, "authorization")
        credential = presents_credential(header) or (kind == "login" and scope["method"] == "POST")
        if credential and not internal and (wait := meter.wait(caller.account)) > 0:
            return wait, None
        app = scope.get("app")
        if kind == "metrics":
            if credential and not login.opens_metrics(header):
                meter.failed(caller.account)
            return 0.0, None
        if app is None or not hasattr(app, "tokens"):
            return 0.0, None
        cookies = asgi.cookies(headers)
        user = cookie_user(app, cookies)
        if user is not None:
            return 0.0, user
        if presents_credential(header):
            user = login.user_of(header)
            if user is None and not internal:
                meter.failed(caller.account)
        if user is None and internal:
            user = "mcp"  # Gradio's MCP server's own client: the tool call it makes carries the caller's login
        if user is not None:
            name, token = login_cookie(app, user)
            asgi.set_header(scope, "cookie", "; ".join([*(f"{k}={v}" for k, v in cookies.items()), f"{name}={token}"]))
        return 0.0, user

    async def _with_body(
        self, scope: Scope, receive: Receive, send: Send, kind: str, caller: Caller, internal: bool
    ) -> None:
        """7. Read the body (at most the cap, and no deeper than the limit), check it, and hand it on."""
        d = self.d
        body = await asgi.read_body(receive, d.max_body_bytes)
        if body is None:
            return await asgi.json(send, 413, f"The request body is over the limit of {d.max_body_bytes} bytes.")
        if kind in JSON_BODIES and await asgi.sized(asgi.too_deep, body):
            return await asgi.json(send, 400, f"The request body nests deeper than {asgi.MAX_JSON_DEPTH} levels.")
        if kind == "mcp":
            return await self._mcp(scope, asgi.replay(body, receive), send, caller)
        if kind in ("join", "call", "cancel"):
            try:
                parsed = await asgi.sized(_loads, body)
                body = self._checked(kind, parsed, scope, caller, internal) or body
            except (ValueError, RecursionError):
                return await asgi.json(send, 400, "The request body must be JSON.")
            except Refused as refused:
                return await asgi.json(send, refused.status, refused.detail)
            session = parsed.get("session_hash") if isinstance(parsed, dict) else None
            if session and not internal and await self._claim(send, caller, str(session)):
                return None
            if kind in ("join", "call"):
                send = asgi.status_recorder(send, lambda status, out: self._created(status, out, caller))
        elif kind == "login":
            send = asgi.status_recorder(send, lambda status, _out: self._logged_in(status, caller))
        await self.app(asgi.with_length(scope, len(body)), asgi.replay(body, receive), send)

    def _created(self, status: int, out: bytes, caller: Caller) -> None:
        """A join or call was answered: the event it created is ``caller``'s (recorded before the answer goes out)."""
        if status == 200:
            try:
                event = orjson.loads(out).get("event_id")
            except (orjson.JSONDecodeError, AttributeError):
                return
            if isinstance(event, str):
                self.d.events.add(event, caller.key)

    def _logged_in(self, status: int, caller: Caller) -> None:
        if status == 400 and self.d.login.auth is not None:  # Gradio's "Incorrect credentials."
            self.d.login.meter.failed(caller.account)

    def _checked(self, kind: str, parsed: Any, scope: Scope, caller: Caller, internal: bool) -> bytes | None:
        """Refuse a bad body (``Refused``); the body to hand on if it had to change, else None."""
        policy, uploads = self.d.policy, self.d.uploads

        # 10. an image input names only the caller's own upload, sent in this session (a join's
        # session_hash; a REST call has none: ``upload_route.NO_SESSION``)
        session = parsed.get("session_hash") if kind == "join" and isinstance(parsed, dict) else None
        session = session if isinstance(session, str) else NO_SESSION

        def owns(path: str) -> bool:
            return uploads is not None and uploads.owned(path, caller.key, session)

        if kind == "join":
            _event, cleaned = policy.check_join(parsed, owns)
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
            policy.check_data(event, data, owns)
            return None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("session_hash"), str):
            raise Refused(400, "A cancel names session_hash, fn_index and event_id.")
        event_id = parsed.get("event_id")
        if isinstance(event_id, str) and not internal and not self.d.events.owned_by(event_id, caller.key):
            raise Refused(404, "No such event.")
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
    login: Login = field(default_factory=lambda: Login(None))
    internal_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    calls: LiveCalls = field(default_factory=LiveCalls)
    connections: ConnectionLimits | None = None  # the connection limits below the door (their counts)
    uploads: UploadBook | None = None  # whose upload is whose (``upload_route``); None: no uploads

    large_bodies: LargeBodies = field(default_factory=LargeBodies)  # ``FrontDoor._large``
    buckets: TokenBucket = field(init=False)
    sessions: SessionBook = field(init=False)
    in_flight: InFlight = field(init=False)
    events: EventBook = field(init=False)

    def __post_init__(self) -> None:
        lim = self.limits
        self.buckets = TokenBucket(lim.joins_per_second, lim.join_burst)
        self.sessions = SessionBook(lim.sessions_per_identity)
        self.in_flight = InFlight(lim.requests_per_identity)
        self.events = EventBook()

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes


async def _too_many(send: Send, wait: float, message: str) -> None:
    await asgi.json(send, 429, message, {"retry-after": str(int(wait) + 1)})


def _in_cache(scope: Scope) -> bool:
    """A ``file=NAME`` whose ``NAME`` is relative (the HTTP APIs' ``url`` answers name their files so,
    never by their place on the disk) is read in Gradio's cache: the scope's path is made absolute
    there for Gradio's route. False for a relative name that leaves the cache (``..``)."""
    prefix, eq, name = scope["path"].partition("file=")
    name = unquote(name)
    if not eq or not name or name.startswith("/") or "://" in name:
        return True
    if len(name) > 512 or name.count("/") > 8:  # the names it gives are two or three parts; resolve() stats each
        return False
    cache = upload_folder().resolve()
    target = (cache / name).resolve()
    if not target.is_relative_to(cache):
        return False
    scope["path"] = f"{prefix}file={target}"
    scope["raw_path"] = quote(scope["path"]).encode()
    return True


def _give_back() -> None:
    """After a large body's request: the young generation collected (an exception's traceback keeps
    the frames that held the body's pictures in a cycle), then every arena's free memory returned
    (``allocator.trim``). Milliseconds, once per large body."""
    gc.collect(1)
    allocator.trim()


def declared_length(headers: list[tuple[str, str]]) -> int:
    """The request's declared ``Content-Length``; a chunked body may be of any size up to the route's
    cap, so it counts as large; no body at all is 0."""
    value = asgi.header(headers, "content-length")
    if value.isascii() and value.isdigit() and len(value) < 16:
        return int(value)
    return LARGE_BODY + 1 if "chunked" in asgi.header(headers, "transfer-encoding").lower() else 0


def _loads(body: bytes) -> Any:
    """A JSON body: orjson, else Python's parser, which also reads the NaN and Infinity Gradio accepts."""
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _drop_unsealed(scope: Scope) -> list[tuple[str, str]]:
    """The request's headers as text; a seal header survives only from loopback and only if it is ours."""
    raw = scope.get("headers") or []
    keep = asgi.is_loopback(scope)
    kept = [(k, v) for k, v in raw if k != b"x-t2i-caller" or (keep and unseal(v.decode("latin-1")) is not None)]
    if len(kept) != len(raw):
        scope["headers"] = kept
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in kept]

"""The front door's mutants (issues 26, 35, 39 and 46): each defence against a hostile client, removed.

Merged into ``tools/mutant_patches.MUTANTS``; ``tools/mutants.py`` names the tests that catch each.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from tools.mutant_seams import Patch, attr, on


def _even_share() -> None:
    """The sweeper of old: a share of the budget over the identities holding files (an attacker's many shrink it)."""
    from pipeline.serving.sweeper import Sweeper

    def over_budget(self: Any, files: list[Any], now: float) -> list[Any]:
        total = sum(size for _, size, _, _ in files)
        if total <= self.max_bytes:
            return []
        victims: list[Any] = []
        usage: dict[str, int] = {}
        sweepable = [f for f in files if now - f[0] > self.min_age]
        for _m, size, path, owner in sweepable:
            if total > self.max_bytes and not owner:
                victims.append(path)
                total -= size
        for _, size, _, owner in files:
            if owner:
                usage[owner] = usage.get(owner, 0) + size
        share = self.max_bytes // max(1, len(usage))
        for owner in sorted(usage, key=usage.__getitem__, reverse=True):
            for _m, size, path, who in sweepable:
                if who == owner and total > self.max_bytes and usage[owner] > share:
                    victims.append(path)
                    usage[owner] -= size
                    total -= size
        return victims

    Sweeper._over_budget = over_budget  # type: ignore[method-assign]


def _unkeyed(owner: str | None, key: bytes) -> str:
    return "shared" if owner is None else "u-" + hashlib.sha256(owner.encode()).hexdigest()[:20]


def _no_text_rules() -> list[Patch]:
    return attr("pipeline.web.door.inputs", "text_problem", lambda value: None) + attr(
        "pipeline.request", "text_problem", lambda value: None
    )


def _traceback_through() -> None:
    from pipeline.web.door.frontdoor import FrontDoor

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        return await self._admit(scope, receive, send)

    FrontDoor.__call__ = call  # type: ignore[method-assign]


def _any_session_owns(self: Any, path: Any, owner: str, session: str = "") -> bool:
    """An upload named by any session of its identity (the binding to the first session dropped)."""
    upload = self._by_path.get(str(path)) if isinstance(path, str) else None
    return upload is not None and upload.owner == owner


def _each_api_request_a_new_user() -> None:
    """The HTTP APIs' requests each enter the line as a user of their own (no fair share, no cap, no quota)."""
    import dataclasses
    import secrets

    import pipeline.web.apis.peer_api as peer_api

    original = peer_api.run_request

    async def run_request(adapter: Any, raw: Any, caller: Any, *args: Any, **kwargs: Any) -> Any:
        return await original(adapter, raw, dataclasses.replace(caller, login=secrets.token_hex(4)), *args, **kwargs)

    peer_api.run_request = run_request


def _interrupt_everyone(self: Any, user: str, abort: Any) -> int:
    """A1111's own ``interrupt``: every job stops, whoever asked."""
    jobs = [job for mine in self.by_user.values() for job in mine.values()]
    for job in jobs:
        job.interrupted = True
        abort(job.request_id, "interrupt")
    return len(jobs)


def _interrupt_by_poll(self: Any, user: str, abort: Any) -> int:
    """The old interrupt: a flag that the liveness watch polls (every 20 ms), not a call to ``abort``."""
    import asyncio

    jobs = self.of(user)
    for job in jobs:
        job.interrupted = True

    async def poll() -> None:
        await asyncio.sleep(0.02)
        for job in jobs:
            abort(job.request_id, "gone")  # what the watch calls when ``alive()`` turns False

    task = asyncio.get_running_loop().create_task(poll())
    self.__dict__.setdefault("_polls", set()).add(task)
    return len(jobs)


def _quota_per_protocol() -> None:
    """The HTTP APIs count their images in a book of their own, apart from the page's."""
    import pipeline.web.apis.peer_api as peer_api
    from pipeline.serving.quota import ImageQuota

    original, books = peer_api.run_request, dict[int, Any]()

    async def run_request(adapter: Any, *args: Any, **kwargs: Any) -> Any:
        saved = adapter.quota
        if saved is not None:
            adapter.quota = books.setdefault(id(adapter), ImageQuota(saved.per_hour))
        try:
            return await original(adapter, *args, **kwargs)
        finally:
            adapter.quota = saved

    peer_api.run_request = run_request


# -- issue 46: hostile round three --------------------------------------------------------------------
_OLD_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # the JSON string pattern that backtracked


def _pillow_png_parameters(data: bytes) -> str:
    """png-info as it was: Pillow's ``text``, which seeks an animated PNG to its last frame."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return str(getattr(image, "text", {}).get("parameters", "") or image.info.get("parameters", ""))


def _decode_at_once(raw: Any, limits: Any, *args: Any, **kwargs: Any) -> Any:
    """``validate`` that decodes the pictures at once, before the quota and the waiting cap answer."""
    from pipeline import request

    return request.validate(raw, limits, *args, **{**kwargs, "pictures_later": False})


async def _decode_anywhere(self: Any, user: Any, fn: Any, *args: Any) -> Any:
    """Every decode in the loop's default pool, no identity's turn (``asyncio.to_thread``, as before)."""
    import asyncio

    return await asyncio.to_thread(fn, *args)


class _NeverDelivered:
    """``Outcome`` whose images are never counted as delivered: a caller that returns at them cancelled."""

    name = "failed"

    @property
    def delivered(self) -> bool:
        return False

    @delivered.setter
    def delivered(self, value: bool) -> None:
        pass


async def _large_at_once(self: Any, scope: Any, receive: Any, send: Any, caller: Any) -> None:
    await self.app(scope, receive, send)


OPEN = frozenset({"login-page", "login", "health", "startup"})  # guards.OPEN_UNDER_AUTH, as reviewed
SECURITY: dict[str, list[Patch]] = {
    # Issue 26.
    "unbounded-inputs": attr("pipeline.web.door.inputs", "_problem", lambda field, value: None),
    "files-pass-the-door": attr("pipeline.web.door.inputs", "file_shaped", lambda value: False),
    "every-route-open": attr("pipeline.web.door.frontdoor", "route_of", lambda method, path: ("page", None)),
    "sessions-not-owned": attr(
        "pipeline.web.door.admission", "SessionBook.claim", lambda self, identity, session: None
    ),
    "no-join-rate": attr("pipeline.web.door.admission", "TokenBucket.take", lambda self, key: 0.0),
    "mcp-caller-unsealed": attr("pipeline.web.door.identity", "unseal", lambda value: None),
    "mcp-disconnect-ignored": attr("pipeline.web.page.site", "LiveCalls.alive", lambda self, call: True),
    "no-cost-budget": attr("pipeline.request", "_within_budget", lambda *args: None),
    "upload-pixel-cap-removed": attr("pipeline.uploads", "pixel_problem", lambda width, height, cap: None),
    "upload-left-unswept": attr("pipeline.web.door.upload_route", "UploadBook._forget_old", lambda self, now: None),
    "url-value-fetched": attr("pipeline.web.door.inputs", "_upload_problem", lambda field, value, owns: None),
    "upload-any-session": attr("pipeline.web.door.upload_route", "UploadBook.owned", _any_session_owns),
    "temp-files-kept": attr("pipeline.web.gradio_internals", "forget_temp_files", lambda demo, paths: 0),
    "shares-ignored": attr("pipeline.serving.sweeper", "_owner_of", lambda directory, top: ""),
    "prompt-lines-kept": attr("pipeline.serving.postprocess", "one_line", lambda text: text),
    # Issue 35.
    "mcp-outside-the-login": attr("pipeline.web.door.frontdoor", "OPEN_UNDER_AUTH", OPEN | {"mcp"}),
    "failed-logins-not-metered": attr("pipeline.web.door.admission", "LoginMeter.wait", lambda self, key: 0.0),
    "heartbeat-outside-the-login": attr(
        "pipeline.web.door.frontdoor",
        "OPEN_UNDER_AUTH",
        frozenset({"login-page", "login", "health", "startup", "heartbeat"}),
    ),
    "owner-folders-unkeyed": attr("pipeline.serving.owners", "owner_folder", _unkeyed),
    "text-not-validated": _no_text_rules(),
    "deep-json-parsed": attr("pipeline.web.door.asgi", "too_deep", lambda body, limit=64: False),
    "cancels-not-rate-limited": attr(
        "pipeline.web.door.frontdoor", "takes_a_token", lambda kind, method: kind in ("join", "call", "login", "mcp")
    ),
    "door-lets-tracebacks-through": on("pipeline.web.door.frontdoor", _traceback_through),
    "call-results-unowned": attr(
        "pipeline.web.door.admission", "EventBook.owned_by", lambda self, event, identity: True
    ),
    "disk-share-shrinks-with-identities": on("pipeline.serving.sweeper", _even_share),
    # Issue 39: the HTTP APIs (A1111's /sdapi/v1, OpenAI's /v1/images) in the page's line.
    "api-requests-skip-the-fair-line": on("pipeline.web.apis.peer_api", _each_api_request_a_new_user),
    "interrupt-acts-globally": attr("pipeline.web.apis.peer_api", "PeerJobs.interrupt", _interrupt_everyone),
    # Issue 47: one stop verb; the old interrupt was a flag polled by the liveness watch.
    "stop-by-poll": attr("pipeline.web.apis.peer_api", "PeerJobs.interrupt", _interrupt_by_poll),
    "quota-per-protocol": on("pipeline.web.apis.peer_api", _quota_per_protocol),
    # Issue 46: nothing small holds the loop or a pool, the decoders bounded by work, gates before
    # work, a quota of work.
    "json-string-pattern-backtracks": attr(
        "pipeline.web.door.asgi", "outside_strings", lambda body: _OLD_STRING.sub(b"", body)
    ),
    "lora-tag-backtracks": attr(
        "pipeline.loras", "TAG", re.compile(r"<lora:([^:<>]+)(?::(-?[0-9]*\.?[0-9]+))?>", re.IGNORECASE)
    ),
    "decode-work-uncapped": attr("pipeline.uploads", "work_problem", lambda data, kind: None),
    "png-info-composes-frames": attr("pipeline.web.apis.sdapi", "_picture_parameters", _pillow_png_parameters),
    "pictures-decoded-before-the-gates": attr("pipeline.serving.local", "validate", _decode_at_once),
    "decodes-in-the-shared-pool": attr("pipeline.serving.decoding", "Decoder.run", _decode_anywhere),
    "quota-given-back-after-steps": attr("pipeline.serving.quota", "Held.ran", lambda self: None),
    "quota-per-address": attr("pipeline.web.door.identity", "Caller.account", property(lambda self: self.key)),
    "api-success-counted-cancelled": attr("pipeline.serving.base", "Outcome", _NeverDelivered),
    "large-bodies-read-at-once": attr("pipeline.web.door.frontdoor", "FrontDoor._large", _large_at_once),
    "large-bodies-memory-kept": attr("pipeline.web.door.frontdoor", "_give_back", lambda: None),
}

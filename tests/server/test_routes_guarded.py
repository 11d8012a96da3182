"""Under ``--auth`` every route Gradio serves is behind the login, but a short reviewed allow-list (issue 35 §5).

The routes are listed from the running server, not from this file, and each is probed with no
login: a Gradio upgrade that adds a route fails here unless the front door guards it (401) or does
not serve it (404), or someone reviews it onto ``ANONYMOUS``.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest

from tests.fakes import FakeModel
from tests.helpers import running_app
from tests.hostile import peer

# What a person who has not logged in may reach, and why. Reviewed: keep it short.
ANONYMOUS = {
    # the login page itself: its HTML, its scripts and styles, and the config that says "log in first"
    "/",
    "/config",
    "/config/",
    "/favicon.ico",
    "/robots.txt",
    "/manifest.json",
    "/theme.css",
    "/pwa_icon",
    "/pwa_icon/{size}",
    "/assets/{path:path}",
    "/static/{path:path}",
    "/svelte/{path:path}",
    "/gradio_api/login_check",
    "/gradio_api/login_check/",
    # logging in and out
    "/login",
    "/login/",
    "/logout",
    # load balancers and Spaces probe it; it shows no user data
    "/health",
    # Gradio's own launch calls it over loopback with no login; it runs the startup events once
    "/gradio_api/startup-events",
}
GUARDED = {401, 404}  # the door's answer without a login, or: not a route of this app


def routes_of(router: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path template) of every route the server serves, included routers and mounts too."""
    for route in router.routes:
        if hasattr(route, "original_router"):  # fastapi's included router (gradio_api/...)
            yield from routes_of(route.original_router, prefix + route.include_context.prefix)
        elif hasattr(route, "routes") and hasattr(route, "path"):  # a starlette Mount
            yield from routes_of(route, prefix + route.path)
            yield "GET", prefix + route.path + "/{path:path}"
        elif hasattr(route, "methods"):
            for method in sorted(route.methods or {"GET"}):
                yield method, prefix + route.path
        elif type(route).__name__ == "WebSocketRoute":
            continue  # the door closes every websocket
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")


def sample(template: str) -> str:
    return re.sub(r"\{[^}:]+\}", "probe", re.sub(r"\{[^}]+:path\}", "a/probe.txt", template))


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with running_app(tmp_path_factory.mktemp("routes"), "--auth", "ann:s3cret", "--mcp", load=FakeModel) as (
        url,
        demo,
        _adapter,
    ):
        yield url, demo


def test_every_gradio_route_is_guarded_or_on_the_reviewed_allow_list(authed: Any) -> None:
    url, demo = authed
    routes = sorted(set(routes_of(demo.server_app.router)))
    paths = {path for _, path in routes}
    assert len(routes) >= 60 and "/gradio_api/heartbeat/{session_hash}" in paths, routes  # the listing works
    open_routes = []
    with peer("127.0.0.70") as anonymous:
        for method, template in routes:
            if template in ANONYMOUS:
                continue
            with anonymous.stream(method, url.rstrip("/") + sample(template), content=b"{}") as answer:
                if answer.status_code not in GUARDED:  # a stream let in is not read: it would never end
                    open_routes.append((method, template, answer.status_code))
    assert not open_routes, f"routes open with no login and not on the reviewed list: {open_routes}"

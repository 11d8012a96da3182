"""Every route this app serves, and the guard each takes at the front door (``frontdoor``).

A route's *kind* says what the door does with it: ``login-page`` and ``login`` (what a login page
needs; open under ``--auth``), ``health`` (open), ``startup`` (Gradio's own launch calls it),
``metrics`` (the login or the metrics token), ``page``, ``file``, ``heartbeat``, ``stream``,
``join``, ``call``, ``cancel``, ``small``, ``upload``, ``mcp`` and ``peer`` (AUTOMATIC1111's and
OpenAI's HTTP APIs) (the login under ``--auth``; the
session, rate and body checks by kind). A route not in ``ROUTES`` is 404 whatever Gradio serves
there, so a Gradio upgrade that adds one opens nothing (``tests/server/test_routes_guarded.py``
lists Gradio's routes at runtime and probes each).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# Route kinds a person who has not logged in may reach under --auth: what the login page needs to
# render and log in; /health (load balancers probe it; no user data); and startup-events, which
# Gradio's launch calls over loopback with no login (it runs the startup events once; then a no-op).
OPEN_UNDER_AUTH = frozenset({"login-page", "login", "health", "startup"})
API = "/gradio_api"
# (methods, path pattern, kind). Everything else is 404. Kinds say what more the door does.
ROUTES: tuple[tuple[frozenset[str], re.Pattern[str], str], ...] = tuple(
    (frozenset(methods.split()), re.compile(pattern), kind)
    for methods, pattern, kind in (
        ("GET HEAD", r"/|/config/?|/favicon\.ico|/robots\.txt|/manifest\.json|/theme\.css", "login-page"),
        ("GET HEAD", r"/pwa_icon(/\d+)?", "login-page"),
        ("GET HEAD", rf"/(assets|static|svelte)/.*|{API}/login_check/?", "login-page"),
        ("GET HEAD", rf"{API}/(info|app_id|user|token|theme\.css|queue/status)/?", "page"),
        ("GET", rf"{API}/startup-events", "startup"),
        ("GET HEAD", r"/health", "health"),
        ("GET HEAD", r"/metrics", "metrics"),
        ("GET HEAD", rf"{API}/file(=|/).*", "file"),
        ("GET", rf"{API}/heartbeat/(?P<session>[^/]*)", "heartbeat"),
        ("GET", rf"{API}/queue/data", "stream"),
        ("GET", rf"{API}/call/(v2/)?generate/(?P<event>[^/]+)", "stream"),
        ("POST", rf"{API}/queue/join", "join"),
        ("POST", rf"{API}/call/(v2/)?(?P<api>generate)/?", "call"),
        ("POST", rf"{API}/cancel", "cancel"),
        ("POST", rf"{API}/reset/?", "small"),
        ("POST", rf"{API}/upload", "upload"),  # the app's own route answers 403: no uploads
        ("POST", r"/login/?", "login"),
        ("GET", r"/logout/?", "login-page"),
        ("GET POST DELETE", rf"{API}/mcp(/.*)?", "mcp"),
        # AUTOMATIC1111's and OpenAI's HTTP APIs (``sdapi``, ``openai_images``): the login, the rate
        # of writes, and each route's own body cap (``lifecycle.PEER_BODY_CAPS``); their handlers
        # read their bodies.
        (
            "GET",
            r"/sdapi/v1/(progress|sd-models|samplers|schedulers|loras|options|scripts|upscalers|latent-upscale-modes"
            r"|sd-vae|embeddings|hypernetworks|face-restorers|realesrgan-models|prompt-styles|cmd-flags)",
            "peer",
        ),
        ("POST", r"/sdapi/v1/(txt2img|img2img|interrupt|options|png-info)", "peer"),
        ("GET", r"/controlnet/(version|model_list|module_list)", "peer"),  # the ControlNet extension's
        ("POST", r"/controlnet/detect", "peer"),
        ("POST", r"/v1/images/(generations|edits)", "peer"),
        ("GET", r"/v1/models", "peer"),
    )
)
JSON_BODIES = ("join", "call", "cancel", "small", "mcp")  # kinds whose bodies the door reads as JSON


def takes_a_token(kind: str, method: str) -> bool:
    """Whether a request takes a token from its identity's bucket (``--rate-limit``): every write
    (each POST: joins, calls, cancels, resets, logins, uploads) and every MCP request."""
    return kind == "mcp" or method == "POST"


def route_of(method: str, path: str) -> tuple[str, re.Match[str] | None] | None:
    for methods, pattern, kind in ROUTES:
        if method in methods and (match := pattern.fullmatch(path)) is not None:
            return kind, match
    return None


def not_a_file_of_ours(path: str) -> bool:
    """A URL (Gradio would stream it), or a hidden file (the key of the owner folders is one)."""
    rest = unquote(path.split("file=", 1)[1] if "file=" in path else path.split("/file/", 1)[-1])
    if "://" in rest or rest.startswith("//") or rest.lower().startswith(("http:", "https:", "data:", "ftp:")):
        return True
    return rest.replace("\\", "/").rsplit("/", 1)[-1].startswith(".")

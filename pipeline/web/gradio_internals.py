"""Every private Gradio attribute this app reads, in one place (pinned: gradio 6.31).

One more reach into Gradio lives beside the feature that needs it: ``mcp_tool.py`` wraps the MCP
server's output conversion (it checks the method's signature when the page is built).

``tests/unit/test_gradio_internals.py`` checks each of them against the installed Gradio, so an upgrade
that renames one fails loudly there instead of silently in production.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

QUEUE_POLL_SECONDS = 0.005  # how often Gradio's dispatcher looks for new work when idle; see tune_queue


def _queue(demo: gr.Blocks) -> Any:
    return demo._queue


def caller_alive(demo: gr.Blocks) -> Callable[[], bool] | None:
    """Whether the caller of the current event is still connected, read from Gradio's queue.

    Gradio marks an event dead the moment its client's stream closes, but the handler only hears
    of it at its next yield, one denoising step later. Reading the flag lets the model stop at the
    end of the step in progress. Best effort: if the event cannot be found, it counts as alive.
    """
    from gradio.context import LocalContext

    event_id = LocalContext.event_id.get(None)
    queue = _queue(demo)
    if event_id is None or queue is None:
        return None

    def alive() -> bool:
        event = queue.event_ids_to_events.get(event_id)  # private: the queue's live events
        return event is None or bool(event.alive)

    return alive


def current_session() -> str | None:
    """The Gradio session hash of the current event's browser tab, if any."""
    from gradio.context import LocalContext

    return getattr(LocalContext.request.get(None), "session_hash", None)


def queued(demo: gr.Blocks) -> int:
    """Events waiting in Gradio's own queue (before any handler runs)."""
    queue = _queue(demo)
    return len(queue) if queue is not None else 0


def tune_queue(demo: gr.Blocks, progress_interval: float) -> None:
    """Slow Gradio's two polling loops, which on Linux wake the event loop 1,100 times a second.

    Its dispatcher sleeps 1 ms whenever nothing is waiting (``sleep_when_free``) and its progress
    sender 10 ms; each wake-up takes the GIL from the model thread between two torch ops. At
    QUEUE_POLL_SECONDS a new event waits at most that long to start, and progress is sent as often
    as the handler streams it anyway.
    """
    queue = _queue(demo)
    if queue is not None:
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_SECONDS)
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, progress_interval)


class _NoBackendSwitch:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def skip_matplotlib_probe() -> bool:
    """Stop Gradio from trying to import matplotlib twice per event when it is not installed.

    Gradio 6.31 wraps every handler call in ``utils.MatplotlibBackendMananger`` (route_utils and
    helpers look it up as ``utils.MatplotlibBackendMananger`` at call time), whose enter and exit
    each ``import matplotlib``. Without matplotlib every attempt is a failed import that walks
    ``sys.path``: 3.6 % of the server's samples under load with the null model (py-spy). Where
    matplotlib is installed nothing changes (a plot component needs its backend switch).
    Returns whether the probe was replaced.
    """
    import importlib.util

    import gradio.utils

    if importlib.util.find_spec("matplotlib") is not None:
        return False
    gradio.utils.MatplotlibBackendMananger = _NoBackendSwitch  # type: ignore[misc,assignment]
    return True


def login_cookie(app: Any, user: str) -> tuple[str, str]:
    """The name and value of a Gradio login cookie for ``user``, minted once per user and reused.

    Gradio's login check reads only its own cookie (``access-token-<cookie_id>``, looked up in
    ``app.tokens``); the front door turns a valid ``Authorization`` header into this cookie, so
    programs (MCP clients, curl, gradio_client without ``auth=``) log in with Basic or Bearer.
    """
    minted: dict[str, str] = app.__dict__.setdefault("_t2i_tokens", {})
    token = minted.get(user)
    if token is None or app.tokens.get(token) != user:  # none yet, or a logout deleted it
        import secrets

        token = secrets.token_urlsafe(32)
        app.tokens[token] = user  # private: Gradio's token -> user table
        minted[user] = token
    return f"access-token-{app.cookie_id}", token


def cookie_user(app: Any, cookies: dict[str, str]) -> str | None:
    """The user a request's Gradio login cookie belongs to (None: not logged in)."""
    token = cookies.get(f"access-token-{app.cookie_id}") or cookies.get(f"access-token-unsecure-{app.cookie_id}")
    return app.tokens.get(token) if token else None


@contextlib.contextmanager
def uvicorn_options(**options: Any) -> Iterator[None]:
    """Set options of the uvicorn ``Config`` that ``demo.launch`` creates (it exposes none of them).

    Gradio 6.31's ``http_server.start_server`` builds ``uvicorn.Config(app, port, host, ...)`` and
    a ``gradio.http_server.Server`` from it; during this block that name is a subclass that sets
    ``options`` on the config first. Used for the HTTP protocol class (``httplimits``) and to turn
    off uvicorn's own ``X-Forwarded-For`` rewriting (``identity`` decides who a client is).
    """
    import gradio.http_server as http_server

    original = http_server.Server

    class Server(original):  # type: ignore[misc,valid-type]
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            for name, value in options.items():
                if not hasattr(config, name):
                    raise RuntimeError(f"uvicorn.Config has no option {name!r}")
                setattr(config, name, value)
            super().__init__(config, *args, **kwargs)

    http_server.Server = Server  # type: ignore[misc]
    try:
        yield
    finally:
        http_server.Server = original  # type: ignore[misc]


def forget_temp_files(demo: gr.Blocks, paths: set[str]) -> int:
    """Drop deleted files from Gradio's temp-file sets (every output path joins one, never to leave)."""
    dropped = 0
    for temp_set in list(demo.temp_file_sets):  # private: one set per component, plus uploads
        before = len(temp_set)
        temp_set.difference_update(paths)
        dropped += before - len(temp_set)
    return dropped


def temp_file_count(demo: gr.Blocks) -> int:
    return sum(len(s) for s in list(demo.temp_file_sets))


def upload_folder() -> Path:
    """Gradio's upload folder (``GRADIO_TEMP_DIR``): an event's file input is taken only from there
    (``processing_utils.get_upload_folder``; Gradio copies it into its cache before the handler runs)."""
    from gradio.processing_utils import get_upload_folder

    return Path(get_upload_folder())


def served_name(path: Path) -> str:
    """``path`` as the HTTP APIs name it to clients: its served copy's name relative to Gradio's cache
    (the front door reads a relative ``file=`` name there), never its place on the disk."""
    return served_path(path).resolve().relative_to(upload_folder().resolve()).as_posix()


def served_names(paths: Sequence[Path]) -> list[str]:
    """``served_name`` of each (blocking where Gradio copies a file into its cache: off the loop)."""
    return [served_name(path) for path in paths]


def served_path(path: Path) -> Path:
    """A file Gradio's ``file=`` route serves: ``path`` itself when it is in Gradio's cache (the
    output folder is, unless ``GRADIO_TEMP_DIR`` says otherwise: ``lifecycle.own_gradio_cache``), else
    Gradio's copy of it there (``processing_utils.save_file_to_cache``; the sweeper ages both folders)."""
    from gradio.processing_utils import save_file_to_cache

    cache = upload_folder().resolve()
    if path.resolve().is_relative_to(cache):
        return path
    return Path(save_file_to_cache(path, str(cache)))

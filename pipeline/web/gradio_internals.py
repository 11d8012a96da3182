"""Every private Gradio attribute this app reads, in one place (pinned: gradio 6.31).

One more reach into Gradio lives beside the feature that needs it: ``mcp_tool.py`` wraps the MCP
server's output conversion (it checks the method's signature when the page is built).

``tests/test_gradio_internals.py`` checks each of them against the installed Gradio, so an upgrade
that renames one fails loudly there instead of silently in production.
"""

from __future__ import annotations

from typing import Any, Callable

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

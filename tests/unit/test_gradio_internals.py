"""Every private Gradio attribute the app reads (``pipeline/web/gradio_internals.py``), pinned.

If an upgrade of Gradio renames one of them, this fails here, loudly, instead of the app quietly
losing its disconnect watch, its queue tuning or its queue depth in ``/health``.
"""

from __future__ import annotations

import inspect
from typing import Any

import gradio as gr
import gradio.context
import gradio.queueing
import gradio.utils
import pytest

from pipeline.web import gradio_internals


def demo_with_queue() -> gr.Blocks:
    with gr.Blocks() as demo:
        gr.Button().click(lambda: None)
    demo.queue()
    return demo


def test_the_blocks_queue_and_its_polling_knobs() -> None:
    demo = demo_with_queue()
    queue: Any = demo._queue
    assert isinstance(queue, gradio.queueing.Queue)
    assert isinstance(queue.event_ids_to_events, dict)
    assert isinstance(queue.sleep_when_free, (int, float)) and isinstance(
        queue.progress_update_sleep_when_free, (int, float)
    )
    assert len(queue) == 0 and gradio_internals.queued(demo) == 0
    gradio_internals.tune_queue(demo, 0.25)
    assert queue.sleep_when_free >= gradio_internals.QUEUE_POLL_SECONDS
    assert queue.progress_update_sleep_when_free >= 0.25


def test_a_queued_event_has_the_alive_flag_the_disconnect_watch_reads() -> None:
    assert "self.alive = True" in inspect.getsource(gradio.queueing.Event.__init__)


def test_the_context_variables_the_handler_reads() -> None:
    assert isinstance(gradio.context.LocalContext.event_id.get(None), (str, type(None)))
    assert gradio.context.LocalContext.request.get(None) is None  # outside an event
    assert gradio_internals.current_session() is None and gradio_internals.caller_alive(demo_with_queue()) is None
    assert callable(gradio.utils.get_upload_folder)


def test_the_mcp_servers_output_conversion_the_tool_wraps() -> None:
    """``web/apis/mcp_tool.py`` wraps ``GradioMCPServer.postprocess_output_data(self, data, root_url)``;
    it raises at build time if the pinned Gradio lacks it, and this build is that check."""
    from pipeline.web.apis.mcp_tool import mcp_outputs, serve_images

    serve_images(demo_with_queue())
    assert mcp_outputs([({"k": 1},)]) == ['{"k": 1}']


def test_without_matplotlib_the_per_event_backend_probe_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradio looks the probe up as ``utils.MatplotlibBackendMananger`` when it calls a handler."""
    import importlib.util
    import inspect

    import gradio.helpers
    import gradio.route_utils
    import gradio.utils

    for module in (gradio.route_utils, gradio.helpers):
        assert "utils.MatplotlibBackendMananger()" in inspect.getsource(module)
    monkeypatch.setattr(gradio.utils, "MatplotlibBackendMananger", gradio.utils.MatplotlibBackendMananger)
    assert importlib.util.find_spec("matplotlib") is None  # not a dependency of this app
    assert gradio_internals.skip_matplotlib_probe() is True
    with gradio.utils.MatplotlibBackendMananger():
        pass
    assert gradio.utils.MatplotlibBackendMananger is gradio_internals._NoBackendSwitch

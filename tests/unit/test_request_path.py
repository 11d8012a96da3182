"""A request's path is short enough to read (issue 37): the modules of the project it touches, from
the handler's ``generate`` to the model thread and back, counted by tracing one request through the
real handler, ``LocalAdapter``, scheduler, ``ModelRunner`` thread and step-level loop (the fake
model's own code aside), and the architecture doc lists the same modules in order."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import gradio as gr

from pipeline.engine.hosting.runner import ModelRunner
from pipeline.request import FIELDS, Limits
from pipeline.serving.local import LocalAdapter
from pipeline.web.page.handler import make_generate
from tests.fakes import FakeModel
from tests.helpers import ROOT, raw_request

# Issue 37's bound was 15 (vLLM's path is about 8 modules; this app's was about 30); issue 47's table
# of request fields (``pipeline.fields``) is the sixteenth, read by every request.
MOST = 16


def _traced_path(tmp: Path) -> list[str]:
    """The project's modules whose functions one request calls, in the order first called."""
    seen: dict[str, None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith("pipeline.") and tracing.is_set():
                seen.setdefault(module, None)

    tracing = threading.Event()

    async def run() -> None:
        model = FakeModel(joining=True, previews=True)
        runner = ModelRunner(lambda: model)
        adapter = LocalAdapter(
            runner, Limits.for_model(runner.start(timeout=10)), tmp, max_batch_size=4, step_joining=True
        )
        try:
            assert adapter.step_joining
            with gr.Blocks() as demo:
                pass
            generate = make_generate(adapter, demo)
            raw = {**raw_request(num_inference_steps=3), "live_preview": True}
            [out async for out in generate(*(raw[f] for f in FIELDS))]  # warm: nothing first-time counts
            tracing.set()
            outputs = [out async for out in generate(*(raw[f] for f in FIELDS))]
            tracing.clear()
            assert outputs[-1][1]["status"] == "done"
        finally:
            adapter.shutdown_model(timeout=10)
            adapter.close()

    threading.setprofile(profile)  # every thread started from here on: the model thread, the pools
    sys.setprofile(profile)
    try:
        asyncio.run(run())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return list(seen)


def test_a_requests_path_touches_at_most_sixteen_modules_and_the_doc_lists_them(tmp_path: Path) -> None:
    path = _traced_path(tmp_path)
    assert len(path) <= MOST, path
    assert {"pipeline.serving.scheduler", "pipeline.engine.hosting.runner", "pipeline.engine.loop.joining"} <= set(
        path
    )  # the trace reached the model thread
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("**A request's path**") :]
    listed = re.findall(r"^\d+\. `(pipeline/[\w/]+)\.py`", section, re.M)
    assert sorted(m.replace("/", ".") for m in listed) == sorted(path), (listed, path)

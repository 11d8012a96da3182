"""The generate handler sends a progress output only when it changes what a person sees.

No server: the handler runs against a scripted adapter, and its outputs and its calls to Gradio's
progress tracker are counted. A 1-step job needs none; "k ahead" is never sent twice the same.
A multi-step job still records every step in the tracker (Gradio sends API callers the latest one
at most every PROGRESS_INTERVAL) but yields an output only when the page would change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncGenerator, Sequence

import gradio as gr
import pytest
from PIL import Image

from pipeline.protocol import EncodedPreview, Output
from pipeline.request import FIELDS
from pipeline.web.page.handler import make_generate
from tests.helpers import raw_request

NEVER = 1e9  # a progress interval no test outlives: only the steps that must be sent are sent
PREVIEW = EncodedPreview.of(Image.new("RGB", (8, 8)))  # as the model side sends one


class ScriptedAdapter:
    """Streams a fixed list of events for every request, as ``Adapter.run`` does."""

    def __init__(self, events: Sequence[Output]) -> None:
        self.events = events

    async def run(
        self, raw: Any, *, request_id: str | None = None, alive: Any = None, user: Any = None, account: Any = None
    ) -> AsyncGenerator[Output, None]:
        for event in self.events:
            yield event


class CountingProgress:
    def __init__(self) -> None:
        self.calls: list[str | None] = []

    def __call__(self, progress: Any, desc: str | None = None, **kwargs: Any) -> None:
        self.calls.append(desc)


def done() -> Output:
    return Output(
        finish="done", paths=(Path("x.png"),), info={"warnings": [], "durations_ms": {"total": 12.0}, "seeds": [1]}
    )


def steps(total: int, preview_every: int = 0) -> list[Output]:
    return [
        Output(step=k, total=total, preview=PREVIEW if preview_every and k % preview_every == 0 else None)
        for k in range(1, total + 1)
    ]


async def shown(
    events: Sequence[Output], num_inference_steps: int, interval: float = NEVER, ui: bool = False
) -> tuple[list[str], int]:
    """(the status of each output the handler yields, its progress tracker calls); the API's by default."""
    with gr.Blocks() as demo:
        pass
    generate = make_generate(ScriptedAdapter(events), demo, ui=ui, progress_interval=interval)
    raw = {**raw_request(num_inference_steps=num_inference_steps), "live_preview": True}
    progress = CountingProgress()
    outputs = [out async for out in generate(*(raw[f] for f in FIELDS), progress=progress)]
    assert all(len(out) == (3 if ui else 2) for out in outputs)
    records = [out[1] for out in outputs]
    statuses = [
        r["status"] + (f" {r.get('ahead', r.get('step', ''))}" if r["status"] != "done" else "") for r in records
    ]
    return statuses, len(progress.calls)


@pytest.mark.anyio
async def test_the_page_gets_the_same_outputs_and_no_progress_messages() -> None:
    """The page's status line shows the step; a progress message would put Gradio's tracker back over the
    gallery (its pending overlay) until the next output, hiding the preview."""
    events = [Output(ahead=1), Output(ahead=0), *steps(8, preview_every=4), done()]
    api, page = await shown(events, 8), await shown(events, 8, ui=True)
    assert page[0] == api[0] == ["waiting 1", "waiting 0", "running 4", "running 8", "done"]
    assert api[1] == 10 and page[1] == 0


@pytest.mark.anyio
async def test_a_one_step_job_sends_only_its_images() -> None:
    assert await shown([Output(ahead=0), Output(step=1, total=1), done()], 1) == (["done"], 0)
    # Its one preview would be replaced by the images at once; no per-step interval changes that.
    assert await shown([Output(ahead=0), Output(step=1, total=1, preview=PREVIEW), done()], 1, interval=0) == (
        ["done"],
        0,
    )


@pytest.mark.anyio
async def test_a_one_step_job_in_line_sees_each_change_of_its_place_once() -> None:
    events = [
        Output(ahead=2),
        Output(ahead=2),
        Output(ahead=1),
        Output(ahead=1),
        Output(ahead=0),
        Output(step=1, total=1),
        done(),
    ]
    # "starting" replaces the "1 ahead" on screen; the repeats are not sent.
    assert await shown(events, 1) == (["waiting 2", "waiting 1", "waiting 0", "done"], 3)


@pytest.mark.anyio
async def test_a_multi_step_job_sends_starting_the_last_step_and_the_latest_preview_per_interval() -> None:
    every_step = 1 + 8  # "starting" and each step, recorded in the tracker (sent by Gradio's timer)
    # Steps faster than the interval: "starting", N/N (the full bar during the decode), the images.
    assert await shown([Output(ahead=0), *steps(8), done()], 8) == (["waiting 0", "running 8", "done"], every_step)
    # The first preview is sent at once; later ones at most once per interval (the latest wins: a fast
    # device makes more than a person sees), and after the first only previews, not even N/N (a
    # progress output has no picture: it would blank the preview on screen until the images come).
    events = [Output(ahead=0), *steps(8, preview_every=3), done()]
    assert await shown(events, 8) == (["waiting 0", "running 3", "done"], every_step)
    assert (await shown(events, 8, interval=0))[0] == [
        "waiting 0",
        "running 1",
        "running 2",
        "running 3",
        "running 6",
        "done",
    ]
    events = [Output(ahead=0), *steps(8, preview_every=4), done()]
    assert await shown(events, 8) == (["waiting 0", "running 4", "running 8", "done"], every_step)
    # Steps slower than the interval: every step, as before.
    statuses, calls = await shown([Output(ahead=0), *steps(4), done()], 4, interval=0)
    assert statuses == ["waiting 0", "running 1", "running 2", "running 3", "running 4", "done"] and calls == 5


def test_the_handlers_are_introspected_once_and_gradio_still_finds_its_parameters() -> None:
    """Gradio reads a handler's signature and type hints on every call; both are resolved at build time."""
    import inspect

    from gradio import helpers

    from pipeline.web.page.handler import make_validator

    with gr.Blocks() as demo:
        pass
    generate = make_generate(ScriptedAdapter([done()]), demo)
    check = make_validator(ScriptedAdapter([]))
    for fn in (generate, check):
        assert inspect.signature(fn) is fn.__signature__
        assert not [name for name, hint in fn.__annotations__.items() if isinstance(hint, str)]
    raw = {**raw_request(), "live_preview": False}
    inputs, progress_index, _, _ = helpers.special_args(generate, [raw[f] for f in FIELDS])
    assert progress_index == len(FIELDS)  # the gr.Progress parameter, found through its resolved hint
    assert (
        inputs[: len(FIELDS)] == [raw[f] for f in FIELDS] and len(inputs) == len(FIELDS) + 3
    )  # + progress, request, profile


@pytest.mark.anyio
async def test_a_consumer_behind_gets_the_latest_step_and_preview_never_a_backlog() -> None:
    """``scheduler.Mailbox``: steps put while the one before is unread replace it (keeping that one's preview
    when the newer has none); a consumer that keeps up reads every step; the end is never coalesced."""
    from pipeline.protocol import InferenceResult
    from pipeline.serving.scheduler import Mailbox

    box = Mailbox()
    box.put(Output(step=1, total=5))
    box.put(Output(step=2, total=5, preview=PREVIEW))
    box.put(Output(step=3, total=5))
    latest = await box.get()
    assert (latest.step, latest.preview) == (3, PREVIEW) and box.coalesced == 2
    box.put(Output(step=4, total=5))
    assert (await box.get()).step == 4
    end = InferenceResult()
    box.put(Output(step=5, total=5))
    box.put(end)
    assert [(await box.get()), (await box.get())] == [Output(step=5, total=5), end]


@pytest.mark.anyio
async def test_a_step_reaches_the_caller_through_at_most_two_async_generators(make_adapter: Any) -> None:
    """Issue 37: from a request's mailbox to the handler's yield, a step crosses the adapter's ``run``
    and the handler's ``generate``, no other async generator (there were five). Counted on the real
    handler over a ``LocalAdapter``: the async-generator frames on the stack when a step leaves the
    mailbox."""
    import inspect
    import sys

    from pipeline.serving.scheduler import Mailbox
    from tests.fakes import FakeModel

    adapter, _model = make_adapter(FakeModel())
    depths: list[int] = []
    original = Mailbox.get

    async def get(self: Mailbox) -> Any:
        item = await original(self)
        frame, depth = sys._getframe(1), 0
        while frame is not None:
            depth += bool(frame.f_code.co_flags & inspect.CO_ASYNC_GENERATOR)
            frame = frame.f_back
        if isinstance(item, Output):
            depths.append(depth)
        return item

    with gr.Blocks() as demo:
        pass
    generate = make_generate(adapter, demo)
    raw = {**raw_request(num_inference_steps=3), "live_preview": False}
    Mailbox.get = get
    try:
        outputs = [out async for out in generate(*(raw[f] for f in FIELDS), progress=CountingProgress())]
    finally:
        Mailbox.get = original
    assert outputs[-1][1]["status"] == "done"
    assert depths and max(depths) <= 2, depths

"""The gate, with a fake model: one inference at a time, and nothing else serialized.

Proven able to fail (see docs/verification.md): removing ``async with self._gate`` makes
``test_eight_concurrent_requests_never_overlap_in_inference`` fail with max_active 8, and wrapping
the whole request in the gate makes both overlap tests time out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FAKE_PROFILE, FakeModel
from tests.helpers import assert_progress, collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


async def test_eight_concurrent_requests_never_overlap_in_inference(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True))
    n = 8
    tasks = [asyncio.create_task(collect(adapter, raw_request(seed=i))) for i in range(n)]
    for released in range(n):
        # Quiescent: every unfinished request is either in the model or waiting at the gate.
        await wait_until(
            lambda: len(model.calls) > released and model.active + adapter.gpu_queue_depth >= n - released,
            f"the next call entered and all {n - released} unfinished requests reach the model or the gate",
        )
        assert model.active == 1, f"{model.active} inferences at once"
        model.release.release()
        await wait_until(lambda: len(model.returned) > released, "the released call returns")
    results = await asyncio.gather(*tasks)
    assert model.max_active == 1
    assert len(model.calls) == n
    assert all(r[-1].kind == "done" for r in results)
    assert sorted(r[-1].info["seed"] for r in results) == list(range(n))


async def test_preparation_overlaps_another_inference(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True))
    first = asyncio.create_task(collect(adapter, raw_request(seed=1)))
    await wait_until(lambda: model.active == 1, "the first request is inferring")
    # The second request's preparation must finish while the first one is still in the model.
    second = adapter.run(raw_request(seed=2))
    event = await asyncio.wait_for(second.__anext__(), timeout=10)
    assert event.kind == "waiting"
    assert event.ahead == 1
    assert model.active == 1 and len(model.calls) == 1
    model.release.release()
    model.release.release()
    rest = [e async for e in second]
    assert rest[-1].kind == "done"
    assert (await first)[-1].kind == "done"


async def test_finalize_overlaps_the_next_inference(make_adapter: Any) -> None:
    """The first request's PNG encoding runs while the second request is in the model."""
    next_in_model = threading.Event()
    encode_saw_next: list[bool] = []

    def encode(images: Any, out_dir: Path, request_id: str, *args: Any) -> list[Path]:
        if request_id == "first":
            # Blocks until the second request is inferring: impossible if finalize were gated.
            encode_saw_next.append(next_in_model.wait(timeout=10))
        from pipeline.serving.postprocess import encode_pngs

        return encode_pngs(images, out_dir, request_id, *args)

    model = FakeModel(hold=True)
    adapter, _ = make_adapter(model, encode=encode)
    first = asyncio.create_task(collect(adapter, raw_request(seed=1), request_id="first"))
    await wait_until(lambda: model.active == 1, "the first request is inferring")
    second = asyncio.create_task(collect(adapter, raw_request(seed=2), request_id="second"))
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "the second request waits at the gate")
    model.release.release()  # the first leaves the model and starts finalizing
    await wait_until(lambda: len(model.calls) == 2 and model.active == 1, "the second request is inferring")
    next_in_model.set()
    first_events = await asyncio.wait_for(first, timeout=10)
    assert model.active == 1, "the first finished while the second was still in the model"
    model.release.release()
    second_events = await second
    assert first_events[-1].kind == "done" and second_events[-1].kind == "done"
    t1, t2 = first_events[-1].info["timings"], second_events[-1].info["timings"]
    assert t1["finalize_start"] < t2["infer_end"] and t2["infer_start"] < t1["finalize_end"]
    assert encode_saw_next == [True]


async def test_progress_events_in_order_and_timings_in_order(make_adapter: Any) -> None:
    adapter, _ = make_adapter()
    events = await collect(adapter, raw_request(num_inference_steps=5, num_images=2))
    assert events[0].kind == "waiting" and events[0].ahead == 0
    steps = [e for e in events if e.kind == "step"]
    assert_progress(steps, 5)
    done = events[-1]
    assert done.kind == "done" and len(done.paths) == 2
    t = done.info["timings"]
    order = [
        "received",
        "prepare_start",
        "prepare_end",
        "gpu_wait_start",
        "infer_start",
        "infer_end",
        "finalize_start",
        "finalize_end",
    ]
    assert [t[k] for k in order] == sorted(t[k] for k in order)
    assert done.info["seeds"] == [1, 2] and done.info["batch_size"] == 2 and done.info["batch_requests"] == 1


async def test_only_a_prompt_that_might_not_fit_is_counted_and_off_the_loop(make_adapter: Any) -> None:
    """Checking the fields runs on the loop (microseconds); counting tokens, which may ask the model
    process, runs only for a prompt that might not fit its encoders' windows, and never on the loop."""
    counted: list[tuple[str, str]] = []
    release = threading.Event()

    def slow_count(text: str) -> None:
        counted.append((text, threading.current_thread().name))
        release.wait(10)

    # a family that cuts CLIP prompts (SD 1.x/2.x reads them whole, in chunks: no note there)
    adapter, _model = make_adapter(
        FakeModel(dataclasses.replace(FAKE_PROFILE, family="pixart"), prepare_hook=slow_count)
    )
    short = await collect(adapter, raw_request(prompt="a red circle"))
    assert counted == [] and short[-1].kind == "done" and short[-1].info["warnings"] == []
    long_prompt = "word " * 80
    job = asyncio.create_task(collect(adapter, raw_request(prompt=long_prompt)))
    await wait_until(lambda: len(counted) == 1, "the long prompt is being counted")
    ticks = 0
    for _ in range(5):  # the loop runs on while the count blocks
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 5 and not job.done()
    release.set()
    events = await job
    assert counted[0][0] == long_prompt and counted[0][1] != threading.main_thread().name
    assert events[-1].kind == "done" and "80 tokens" in events[-1].info["warnings"][0]

"""The wait estimate (``pipeline/serving/eta.py``): measured rates per shape, and the adapter's ETA.

The unit tests feed the book exact numbers. The adapter test runs the fake model with a fixed
compute time per step (``step_seconds``) and compares each estimate with the wait that followed,
as a ratio with generous bounds (0.5x-2x): it checks the method, not this machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pipeline.protocol import Output
from pipeline.serving.eta import ALPHA, EtaBook, JobClock, Shape
from tests.fakes import FakeModel
from tests.helpers import raw_request, wait_until

SMALL = Shape(pixels=64 * 64, steps=10, images=1)
LARGE = Shape(pixels=128 * 128, steps=10, images=1)  # 4x the pixels per step
BOUNDS = (0.5, 2.0)  # estimate / real wait, once warm


def test_no_estimate_before_the_first_measurement() -> None:
    book = EtaBook()
    assert book.job_seconds(SMALL) is None and book.step_seconds(SMALL) is None
    assert JobClock(SMALL, now=0.0).remaining(book, now=1.0) is None


def test_a_measured_shape_is_estimated_from_its_own_head_steps_and_tail() -> None:
    book = EtaBook()
    book.record(SMALL, head=0.5, step=0.1, tail=0.2)
    assert book.step_seconds(SMALL) == pytest.approx(0.1)
    assert book.job_seconds(SMALL) == pytest.approx(0.5 + 10 * 0.1 + 0.2)
    # A running mean: the next job of the shape moves the estimate by ALPHA of the difference.
    book.record(SMALL, head=0.5, step=0.2, tail=0.2)
    rate = 4096 / 0.1 + ALPHA * (4096 / 0.2 - 4096 / 0.1)
    assert book.step_seconds(SMALL) == pytest.approx(4096 / rate)


def test_each_shape_keeps_its_own_rate_and_an_unseen_one_falls_back_to_the_global_rate() -> None:
    book = EtaBook()
    # The large shape runs at half the small one's pixel-steps per second (memory-bound, say).
    book.record(SMALL, head=0.0, step=0.1, tail=0.0)
    book.record(LARGE, head=0.0, step=0.8, tail=0.0)
    assert book.step_seconds(SMALL) == pytest.approx(0.1)  # its own rate, not the mean of both
    assert book.step_seconds(LARGE) == pytest.approx(0.8)
    # An unseen shape: the global rate (a running mean over every job) scaled by its pixel-steps.
    unseen = Shape(pixels=64 * 64, steps=20, images=2)
    global_rate = 4096 / 0.1 + ALPHA * (16384 / 0.8 - 4096 / 0.1)
    assert book.step_seconds(unseen) == pytest.approx(2 * 4096 / global_rate)
    assert book.job_seconds(unseen) == pytest.approx(20 * 2 * 4096 / global_rate)


def test_a_one_step_job_is_split_with_the_head_already_known() -> None:
    book = EtaBook()
    book.record(SMALL, head=0.3, step=0.1, tail=0.0)
    one = Shape(pixels=64 * 64, steps=1, images=1)
    book.record(one, head=0.3 + 0.1, step=None, tail=0.05)  # head and the one step together
    assert book.step_seconds(one) == pytest.approx(0.1)
    assert book.job_seconds(one) == pytest.approx(0.3 + 0.1 + 0.05)


def test_the_running_job_has_its_steps_left_times_its_own_step_time_left() -> None:
    book = EtaBook()
    book.record(SMALL, head=0.0, step=0.1, tail=0.2)
    clock = JobClock(SMALL, now=100.0)
    assert clock.remaining(book, now=100.0) == pytest.approx(10 * 0.1 + 0.2)  # the whole job
    clock.on_step(1, 10, now=100.5)
    assert clock.remaining(book, now=100.5) == pytest.approx(9 * 0.1 + 0.2)  # the book's step time
    clock.on_step(4, 10, now=101.1)  # this job runs at 0.2 s a step: its own measure wins
    assert clock.remaining(book, now=101.1) == pytest.approx(6 * 0.2 + 0.2)
    clock.finish(book, now=101.1 + 6 * 0.2 + 0.3)  # never reached step 10: recorded as it was seen
    assert book.shapes[SMALL].tail.value is not None


@pytest.mark.anyio
async def test_once_warm_the_wait_estimate_is_within_a_factor_of_two_of_the_real_wait(make_adapter: Any) -> None:
    steps = 10
    adapter, model = make_adapter(FakeModel(step_seconds=0.03), max_batch_size=1)

    async def run(rid: str, seen: list[tuple[float, Any]]) -> None:
        async for event in adapter.run(raw_request(seed=len(seen), num_inference_steps=steps), request_id=rid):
            seen.append((time.monotonic(), event))

    cold: list[tuple[float, Any]] = []
    await run("cold", cold)
    # Nothing measured yet: no estimate while waiting or at step 1; from step 2 the job's own step time.
    assert all(e.eta_seconds is None for _, e in cold if e.kind == "waiting" or getattr(e, "step", 0) == 1)
    assert all(e.eta_seconds is not None for _, e in cold if e.kind == "step" and e.step >= 2)
    await run("warm", [])  # a second measurement of the shape

    # One job runs; four wait behind it, in order. The last one waits for all five.
    seen: dict[str, list[tuple[float, Any]]] = {rid: [] for rid in "abcde"}
    tasks = [asyncio.create_task(run("a", seen["a"]))]
    await wait_until(lambda: model.active == 1, "a is in the model")
    for i, rid in enumerate("bcde"):
        tasks.append(asyncio.create_task(run(rid, seen[rid])))
        await wait_until(lambda: adapter.gpu_queue_depth == i + 1, f"{rid} waits")
    await asyncio.gather(*tasks)

    ratios = {}
    for rid in "bcde":
        at, first = next((t, e) for t, e in seen[rid] if e.kind == "waiting")
        done_at = next(t for t, e in seen[rid] if e.kind == "done")
        assert first.ahead == 1 + "bcde".index(rid) and first.eta_seconds is not None
        ratios[rid] = first.eta_seconds / (done_at - at)
    # While running: the time left at the middle step, against the time the job really took from there.
    at, middle = next((t, e) for t, e in seen["e"] if e.kind == "step" and e.step == steps // 2)
    done_at = next(t for t, e in seen["e"] if e.kind == "done")
    assert middle.eta_seconds is not None
    ratios["e running"] = middle.eta_seconds / (done_at - at)
    assert all(BOUNDS[0] <= r <= BOUNDS[1] for r in ratios.values()), ratios


def test_the_page_says_about_n_s_while_waiting_and_n_s_left_while_running() -> None:
    from pipeline.web.page.shown import ProgressView, duration_text, step_text

    view = ProgressView(20)
    assert view.waiting(2, None) == "waiting for the GPU: 2 ahead"  # nothing measured yet
    assert view.waiting(1, 12.4) == "waiting for the GPU: 1 ahead, about 12 s"
    assert view.waiting(0, 3.0) == "starting"
    assert step_text(Output(step=3, total=20, eta_seconds=11.6)) == "step 3/20 · 12 s left"
    assert step_text(Output(step=20, total=20, eta_seconds=0.3)) == "step 20/20"  # the decode: no countdown at the end
    assert step_text(Output(step=3, total=20)) == "step 3/20"
    assert [duration_text(s) for s in (0.4, 59.6, 125)] == ["under 1 s", "1 min", "2 min 5 s"]

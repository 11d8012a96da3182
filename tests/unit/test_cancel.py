"""Cancel and shutdown at the adapter, with a fake model gated step by step.

``tools/mutants.py`` proves these can fail: with the plain ``to_thread`` design (a thread per job,
the gate released as soon as the waiting coroutine is cancelled) the next job's inference starts
beside the cancelled one and ``test_cancel_mid_inference...`` fails.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pipeline.errors import ShuttingDown
from tests.fakes import FakeModel
from tests.helpers import collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


async def test_cancel_while_waiting_never_reaches_the_model(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True))
    first = asyncio.create_task(collect(adapter, raw_request(), request_id="first"))
    await wait_until(lambda: model.active == 1, "the first request is inferring")
    waiting = asyncio.create_task(collect(adapter, raw_request(), request_id="waiting"))
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "the second request waits at the gate")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert adapter.gpu_queue_depth == 0
    model.release.release()
    assert (await first)[-1].kind == "done"
    third = asyncio.create_task(collect(adapter, raw_request(), request_id="third"))  # the line still moves
    await wait_until(lambda: model.active == 1, "the third request is inferring")
    model.release.release()
    assert (await third)[-1].kind == "done"
    assert [job.request_id for job in model.calls] == ["first", "third"]
    assert _jobs(adapter, "cancelled") == 1 and _jobs(adapter, "completed") == 2


async def test_cancel_mid_inference_stops_within_one_step_and_holds_the_gate(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=steps))
    seen: list[int] = []

    async def consume() -> None:
        async for event in adapter.run(raw_request(num_inference_steps=20), request_id="victim"):
            if event.kind == "step":
                seen.append(event.step)

    victim = asyncio.create_task(consume())
    for _ in range(3):
        steps.release()
    await wait_until(lambda: seen[-1:] == [3], "the victim ran 3 steps")
    nxt = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=2), request_id="next"))
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "the next request waits at the gate")
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(victim, 5)  # the request leaves at once...
    await asyncio.sleep(0.05)  # (time for a gate that opens too early to let the next job in)
    # ...but the model thread is still inside step 4: the gate must still be held.
    assert adapter.inference_in_progress and [j.request_id for j in model.calls] == ["victim"]
    for _ in range(10):
        steps.release()  # enough permits for the victim's next step and all of the next job's
    result = await asyncio.wait_for(nxt, timeout=20)
    assert result[-1].kind == "done"
    assert model.steps_run["victim"] <= 4, "more than one step ran after the cancel"
    assert model.max_active == 1
    assert model.decodes == 1  # the next job's; the victim never decoded
    assert model.log.index(("return", "victim")) < model.log.index(("enter", "next"))


async def test_a_request_is_stopped_by_its_id_waiting_or_running_and_no_other_with_it(make_adapter: Any) -> None:
    """``LocalAdapter.abort(request_id)``: the running request stops within a step, a waiting one
    never reaches the model, the request beside them runs on, and an unknown id stops nothing."""
    from pipeline.errors import Cancelled

    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=steps))
    running = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=20), request_id="running"))
    steps.release()
    await wait_until(lambda: model.steps_run.get("running", 0) >= 1, "the first request runs")
    waiting = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=2), request_id="waiting"))
    other = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=2), request_id="other"))
    await wait_until(lambda: adapter.gpu_queue_depth == 2, "two requests wait")
    assert not adapter.abort("nobody")
    assert adapter.abort("waiting")
    with pytest.raises(Cancelled):
        await asyncio.wait_for(waiting, 5)
    assert adapter.abort("running")
    for _ in range(10):
        steps.release()
    with pytest.raises(Cancelled):
        await asyncio.wait_for(running, 5)
    assert (await asyncio.wait_for(other, 20))[-1].kind == "done"
    assert model.steps_run["running"] <= 2, "more than one step ran after the stop"
    assert [job.request_id for job in model.calls] == ["running", "other"]
    assert not adapter.abort("other")  # ended: its stop is forgotten


async def test_close_at_a_yield_stops_the_model_thread(make_adapter: Any) -> None:
    """A disconnect closes the handler's generator at a yield (GeneratorExit, not CancelledError)."""
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=steps))
    gen = adapter.run(raw_request(num_inference_steps=20), request_id="closed")
    steps.release()
    async for event in gen:
        if event.kind == "step":
            break
    await gen.aclose()  # the request leaves at once, while the model thread is mid-step...
    assert adapter.inference_in_progress  # ...which still holds the gate
    steps.release(5)  # the step in progress ends; the job stops there
    await wait_until(lambda: not adapter.inference_in_progress, "the job stops and the gate opens")
    assert model.steps_run["closed"] <= 2 and model.decodes == 0
    assert _jobs(adapter, "cancelled") == 1


async def test_waiting_reports_how_many_are_ahead_as_the_line_moves(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), report_interval=0)
    tasks = [asyncio.create_task(collect(adapter, raw_request(), request_id=f"r{i}")) for i in range(3)]
    for i in range(3):
        await wait_until(lambda: len(model.calls) == i + 1, f"call {i} entered")
        model.release.release()
    results = await asyncio.gather(*tasks)
    ahead = {r[-1].info["request_id"]: [e.ahead for e in r if e.kind == "waiting"] for r in results}
    assert ahead["r0"] == [0]
    assert ahead["r1"] == [1, 0]
    assert ahead["r2"] == [2, 1, 0]


async def test_reports_inside_the_interval_are_folded_into_one_sent_when_it_is_up(make_adapter: Any) -> None:
    """On a fast device the line moves every few ms: one "k ahead" per interval, with the count of when it
    is sent, and sent when the interval is up even if the line then stands still (no stale count)."""
    interval = 1.0
    adapter, model = make_adapter(FakeModel(hold=True), report_interval=interval)
    seen: dict[str, list[tuple[float, int]]] = {}
    loop = asyncio.get_running_loop()

    async def watch(rid: str) -> None:
        seen[rid] = []
        async for event in adapter.run(raw_request(), request_id=rid):
            if event.kind == "waiting":
                seen[rid].append((loop.time(), event.ahead))

    running = asyncio.create_task(watch("running"))
    await wait_until(lambda: len(model.calls) == 1, "the first job holds the gate")
    waiting = {rid: asyncio.create_task(watch(rid)) for rid in ("a", "b", "last")}
    await wait_until(lambda: [a for _, a in seen.get("last", [])] == [3], "the last one is told 3 ahead")
    start = loop.time()
    waiting["a"].cancel()  # two moves inside the interval, then the line stands still
    waiting["b"].cancel()
    await wait_until(lambda: len(seen["last"]) == 2, "one report of both moves", timeout=10 * interval)
    (first_at, _), (then_at, ahead) = seen["last"]
    assert ahead == 1  # the count when it was sent: both moves, in one report
    assert then_at - first_at >= interval * 0.99 and then_at >= start
    await asyncio.sleep(0.1)
    assert len(seen["last"]) == 2  # nothing more while the line stands still
    model.release.release()
    model.release.release()
    await asyncio.gather(running, waiting["last"])
    assert [a for _, a in seen["last"]] == [3, 1, 0]


async def test_shutdown_answers_the_waiting_and_stops_the_running_job(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=steps))
    running = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=50), request_id="running"))
    steps.release()
    await wait_until(lambda: model.steps_run.get("running") == 1, "the job runs")
    waiting = [asyncio.create_task(collect(adapter, raw_request(), request_id=f"w{i}")) for i in range(3)]
    await wait_until(lambda: adapter.gpu_queue_depth == 3, "three wait at the gate")
    adapter.begin_shutdown()
    steps.release(5)
    outcomes = await asyncio.gather(running, *waiting, return_exceptions=True)
    late = await asyncio.gather(collect(adapter, raw_request()), return_exceptions=True)
    outcomes = [*outcomes, *late]
    assert all(isinstance(o, ShuttingDown) for o in outcomes), outcomes
    assert "shutting down" in str(outcomes[0]) and "retry" in str(outcomes[0])
    assert [j.request_id for j in model.calls] == ["running"] and model.steps_run["running"] <= 2
    assert adapter.health()["status"] == "degraded"


def _jobs(adapter: Any, outcome: str) -> float:
    value = adapter.metrics.registry.get_sample_value("jobs_total", {"outcome": outcome})
    return float(value or 0)

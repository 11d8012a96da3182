"""One stop verb (issue 47 §4): every way of stopping a request reaches the model through
``Adapter.abort(request_id, reason)``, within one step, and is counted by its reason in
``stops_total`` (the HTTP APIs' interrupt and disconnect: ``tests/server/test_peer_apis.py``).

``tools/mutants.py``'s ``stop-by-poll`` brings back the old way (a flag the liveness watch polls
instead of a call); the interrupt's test then counts the stop as ``gone``, not ``interrupt``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pipeline.serving.base import STOP_REASONS
from tests.fakes import FakeModel
from tests.helpers import raw_request, wait_until

pytestmark = pytest.mark.anyio


def stops(adapter: Any) -> dict[str, float]:
    """``stops_total`` by reason, as /metrics reports it (only the reasons counted)."""
    read = adapter.metrics.registry.get_sample_value
    return {reason: n for reason in STOP_REASONS if (n := read("stops_total", {"reason": reason}))}


@pytest.mark.parametrize("way", ["closed", "gone", "abort", "shutdown", "time_limit"])
async def test_every_way_of_stopping_reaches_the_model_within_one_step_through_abort(
    make_adapter: Any, way: str
) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=steps), job_timeout=1.0 if way == "time_limit" else None)
    here = [True]
    seen: list[int] = []

    async def consume() -> None:
        alive = (lambda: here[0]) if way == "gone" else None
        async for event in adapter.run(raw_request(num_inference_steps=50), request_id="r", alive=alive):
            seen.append(event.step)

    task = asyncio.create_task(consume())
    steps.release(3)
    await wait_until(lambda: seen[-1:] == [3], "three steps ran")
    if way == "closed":  # Stop, Escape, a cancelled job: the caller closes its stream
        task.cancel()
    elif way == "gone":  # a closed tab, a dropped client: Gradio marks the event dead
        here[0] = False
    elif way == "abort":  # AUTOMATIC1111's interrupt, an HTTP client's disconnect: a caller calls it
        assert adapter.abort("r", "interrupt") and not adapter.abort("nobody", "interrupt")
    elif way == "shutdown":
        adapter.begin_shutdown()
    reason = {"abort": "interrupt"}.get(way, way)
    await wait_until(lambda: stops(adapter) == {reason: 1.0}, f"the stop is counted as {reason}", timeout=10)
    steps.release(10)  # permits for more steps than a stop allows
    with pytest.raises(BaseException):  # noqa: B017 -- cancelled, stopped, shut down or timed out: not done
        await asyncio.wait_for(task, 20)
    await wait_until(lambda: not adapter.inference_in_progress, "the model has left the job")
    assert model.steps_run["r"] <= 4, f"{model.steps_run['r']} steps ran: more than one after the stop"
    assert model.decodes == 0
    assert adapter.abort("r", "closed") is False  # ended: nothing left to stop
    assert stops(adapter) == {reason: 1.0}  # counted once, under its first reason

"""A fair share of the GPU for every user (issue 19, section 6), with a fake model.

The line admits users round-robin (the user served longest ago first), each user's own requests in
order; a user past ``max_waiting_per_user`` is refused at once. Each test holds the first job in the
model so the others line up at the gate, then lets the jobs through and reads ``model.calls``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.errors import TooManyWaiting
from tests.fakes import FakeModel
from tests.helpers import collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


async def _queue(adapter: Any, tasks: list[asyncio.Task[Any]], rid: str, user: str) -> None:
    """Start request ``rid`` of ``user`` and wait until it waits at the gate."""
    depth = adapter.gpu_queue_depth
    tasks.append(asyncio.create_task(collect(adapter, raw_request(prompt=rid), request_id=rid, user=user)))
    await wait_until(lambda: adapter.gpu_queue_depth == depth + 1, f"{rid} waits at the gate")


def _jobs(model: FakeModel) -> list[list[str]]:
    return [job.request_id.split(",") for job in model.calls]


async def test_a_light_users_first_request_waits_at_most_one_job_per_other_user(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=1)
    tasks = [asyncio.create_task(collect(adapter, raw_request(), request_id="h0", user="heavy"))]
    await wait_until(lambda: model.active == 1, "the heavy user's first job is in the model")
    heavy = [f"h{i}" for i in range(1, 21)]
    for rid in heavy:
        await _queue(adapter, tasks, rid, "heavy")
    for rid, user in (("l1", "light"), ("m1", "medium"), ("l2", "light")):
        await _queue(adapter, tasks, rid, user)
    for _ in range(len(tasks)):
        model.release.release()
    results = await asyncio.gather(*tasks)
    assert all(r[-1].kind == "done" for r in results)
    # Round-robin from the user served longest ago (never: first, by arrival); each user's own in order.
    assert _jobs(model) == [["h0"], ["l1"], ["m1"], ["h1"], ["l2"], ["h2"]] + [[rid] for rid in heavy[2:]]
    # "k ahead" follows the same order: l1 was next, behind only the running job.
    light_first = results[21]
    assert next(e.ahead for e in light_first if e.kind == "waiting") == 1


async def test_a_job_takes_compatible_requests_in_the_fair_order(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=2)
    tasks = [asyncio.create_task(collect(adapter, raw_request(), request_id="h0", user="heavy"))]
    await wait_until(lambda: model.active == 1, "the heavy user's first job is in the model")
    for rid in ("h1", "h2", "h3"):
        await _queue(adapter, tasks, rid, "heavy")
    await _queue(adapter, tasks, "l1", "light")
    for _ in range(len(tasks)):
        model.release.release()
    await asyncio.gather(*tasks)
    assert _jobs(model) == [["h0"], ["l1", "h1"], ["h2", "h3"]]


async def test_past_the_cap_a_request_is_refused_at_once(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=1, max_waiting_per_user=2)
    tasks = [asyncio.create_task(collect(adapter, raw_request(), request_id="h0", user="heavy"))]
    await wait_until(lambda: model.active == 1, "the heavy user's first job is in the model")
    for rid in ("h1", "h2"):
        await _queue(adapter, tasks, rid, "heavy")
    message = r"^You already have 2 requests waiting; please wait for them to finish\.$"
    with pytest.raises(TooManyWaiting, match=message):
        await asyncio.wait_for(collect(adapter, raw_request(), request_id="h3", user="heavy"), 5)
    await _queue(adapter, tasks, "l1", "light")  # another user is still let in
    for _ in range(len(tasks)):
        model.release.release()
    await asyncio.gather(*tasks)
    assert _jobs(model) == [["h0"], ["l1"], ["h1"], ["h2"]]

"""Step-level batching at the adapter, with the fake model's loop (``FakeLoop``): requests join a
running loop at a step boundary and leave when their own steps are done (issue 19, sections 1-4).

Every step of the loop waits for a permit (``step_gate``), so a test decides how far the loop has
run when a request arrives; ``FakeModel.loop_step_started`` says the loop is blocked in a step, and
``FakeModel.loop_steps`` records, per loop step, which requests ran and at which of their own steps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pipeline.errors import JobTimedOut
from tests.fakes import FakeModel
from tests.helpers import assert_progress, collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


def _joining(**kw: Any) -> FakeModel:
    return FakeModel(joining=True, previews=True, **kw)


async def _start(adapter: Any, rid: str, **raw: Any) -> asyncio.Task[list[Any]]:
    return asyncio.create_task(collect(adapter, raw_request(**raw), request_id=rid))


def _members(model: FakeModel, step: int) -> list[str]:
    """Who ran loop step ``step`` (1-based)."""
    return [rid for rid, _ in model.loop_steps[step - 1]]


async def _handed_to_model(adapter: Any, n: int = 1) -> None:
    """``n`` joiners wait in the model thread's queue (the loop takes them at its next boundary)."""
    await wait_until(lambda: adapter.side._tasks.qsize() == n, f"{n} job(s) wait on the model thread")


async def _loop_blocked_in(model: FakeModel, step: int) -> None:
    await wait_until(lambda: model.loop_step_started == step, f"the loop waits in step {step}")


async def test_a_late_request_joins_the_running_loop_at_the_next_step_boundary(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=4, step_joining=True)
    assert adapter.step_joining
    a = await _start(adapter, "a", num_inference_steps=6, seed=1)
    await _loop_blocked_in(model, 1)
    steps.release(2)
    await _loop_blocked_in(model, 3)  # a has run 2 steps; step 3 waits for its permit
    b = await _start(adapter, "b", num_inference_steps=4, seed=2, prompt="a blue square", guidance_scale=2.0)
    await wait_until(lambda: adapter.gpu_queue_depth == 0, "b has left the line for the loop")
    await _handed_to_model(adapter)
    assert len(model.calls) == 1  # b waits for the boundary, not for a's end
    steps.release(10)
    ra, rb = await asyncio.gather(a, b)
    # b entered at the boundary after the step in progress: loop step 4, a's own step 4.
    assert _members(model, 3) == ["a"] and _members(model, 4) == ["a", "b"]
    assert model.loop_steps[3] == (("a", 4), ("b", 1))
    # Each keeps its own progress (k of its own N) and its own images and parameters.
    assert_progress([e for e in rb if e.kind == "step"], 4)
    assert_progress([e for e in ra if e.kind == "step"], 6)
    da, db = ra[-1], rb[-1]
    assert da.kind == "done" and db.kind == "done"
    assert db.info["batching"] == "step" and db.info["joined_at_step"] == 3
    assert da.info["batching"] == "step" and da.info["joined_at_step"] == 0
    assert db.info["batch_size"] == 2 and db.info["batch_requests"] == 2
    assert db.info["num_inference_steps"] == 4 and db.info["guidance_scale"] == 2.0 and db.info["steps_done"] == 4
    jobs = {job.request_id: job for job in model.calls}
    assert jobs["b"].guidance_scale == 2.0 and jobs["b"].prompts == ("a blue square",) and jobs["b"].joinable
    assert model.max_active == 2 and not adapter.inference_in_progress


async def test_a_member_leaves_when_its_own_steps_are_done_and_is_decoded_then(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=4, step_joining=True)
    a = await _start(adapter, "a", num_inference_steps=8)
    await _loop_blocked_in(model, 1)
    b = await _start(adapter, "b", num_inference_steps=2, guidance_scale=1.0)
    await _handed_to_model(adapter)
    steps.release(3)  # loop steps 1-3: b (joined at step 2) runs steps 2 and 3, then leaves
    rb = await b
    assert rb[-1].kind == "done"
    assert model.decodes_by_id == {"b": 1} and not a.done()  # b decoded while a keeps running
    steps.release(10)
    ra = await a
    assert ra[-1].kind == "done" and ra[-1].info["steps_done"] == 8
    assert [len(s) for s in model.loop_steps] == [1, 2, 2, 1, 1, 1, 1, 1]
    assert model.returned == ["b", "a"]


async def test_cancelling_one_member_leaves_the_others_untouched(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=4, step_joining=True)
    a = await _start(adapter, "a", num_inference_steps=6, seed=1)
    await _loop_blocked_in(model, 1)
    b = await _start(adapter, "b", num_inference_steps=6, seed=2)
    await _handed_to_model(adapter)
    steps.release(2)
    await wait_until(lambda: model.steps_run.get("b") == 1, "b ran a step")
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(b, 5.0)  # it leaves at once
    steps.release(10)
    ra = await a
    assert ra[-1].kind == "done" and ra[-1].info["steps_done"] == 6
    assert model.steps_run["b"] <= 3  # at most one more step after its stop
    assert "b" not in model.decodes_by_id and model.decodes_by_id == {"a": 1}
    assert_progress([e for e in ra if e.kind == "step"], 6)


async def test_joiners_enter_in_fifo_order_and_an_incompatible_head_is_never_overtaken(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=2, step_joining=True)
    a = await _start(adapter, "a", num_inference_steps=3)
    await _loop_blocked_in(model, 1)
    b = await _start(adapter, "b", num_inference_steps=3)  # joins: room for one more image
    await wait_until(lambda: adapter.gpu_queue_depth == 0, "b is in the loop")
    c = await _start(adapter, "c", num_inference_steps=3)  # no room: waits for a member to leave
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "c waits")
    x = await _start(adapter, "x", num_inference_steps=3, width=128)  # another size: another loop
    y = await _start(adapter, "y", num_inference_steps=3)  # compatible, but x is ahead of it
    await wait_until(lambda: adapter.gpu_queue_depth == 3, "x and y wait")
    steps.release(30)
    results = await asyncio.gather(a, b, c, x, y)
    assert all(r[-1].kind == "done" for r in results)
    order = [job.request_id for job in model.calls]
    assert order == ["a", "b", "c", "x", "y"]
    # c joined a's loop when a left; y did not jump x (the loop drained, then x's own loop ran).
    infos = {r[-1].info["request_id"]: r[-1].info for r in results}
    assert infos["x"]["joined_at_step"] == 0 and all(info["batching"] == "step" for info in infos.values())
    x_steps = [i for i, s in enumerate(model.loop_steps) if any(rid == "x" for rid, _ in s)]
    y_steps = [i for i, s in enumerate(model.loop_steps) if any(rid == "y" for rid, _ in s)]
    c_steps = [i for i, s in enumerate(model.loop_steps) if any(rid == "c" for rid, _ in s)]
    a_steps = [i for i, s in enumerate(model.loop_steps) if any(rid == "a" for rid, _ in s)]
    assert max(a_steps) < min(c_steps)  # c entered when a left
    assert max(c_steps) < min(x_steps) <= min(y_steps)
    assert all(not {rid for rid, _ in s} >= {"x", "c"} for s in model.loop_steps)


async def test_max_batch_size_bounds_the_images_in_the_loop(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=3, step_joining=True)
    tasks = [await _start(adapter, "a", num_images=2, num_inference_steps=4)]
    await _loop_blocked_in(model, 1)
    for rid, n in (("b", 2), ("c", 1), ("d", 1)):
        tasks.append(await _start(adapter, rid, num_images=n, num_inference_steps=2))
    await wait_until(lambda: adapter.gpu_queue_depth == 3, "b (too big for now) and those behind it wait")
    steps.release(40)
    results = await asyncio.gather(*tasks)
    assert all(r[-1].kind == "done" for r in results)
    jobs = {job.request_id: job.num_images for job in model.calls}
    held = [sum(jobs[rid] for rid, _ in s) for s in model.loop_steps]
    assert max(held) == 3 and all(n <= 3 for n in held)
    assert [job.request_id for job in model.calls] == ["a", "b", "c", "d"]  # c never jumped b


async def test_members_may_differ_in_steps_guidance_prompt_and_image_count(make_adapter: Any) -> None:
    adapter, model = make_adapter(_joining(hold=False), max_batch_size=8, step_joining=True)
    steps = threading.Semaphore(0)
    model.step_gate = steps
    spec = {
        "a": dict(num_inference_steps=5, guidance_scale=7.5, prompt="a cat", seed=10),
        "b": dict(num_inference_steps=2, guidance_scale=1.0, prompt="a dog", seed=20, num_images=2),
        "c": dict(num_inference_steps=9, guidance_scale=3.0, prompt="a fish", seed=30, negative_prompt="dark"),
    }
    tasks = [await _start(adapter, rid, **raw) for rid, raw in spec.items()]
    steps.release(50)
    results = await asyncio.gather(*tasks)
    from PIL import Image

    for (_rid, raw), result in zip(spec.items(), results):
        done = result[-1]
        assert done.kind == "done", result
        assert done.info["steps_done"] == raw["num_inference_steps"]
        assert done.info["guidance_scale"] == raw["guidance_scale"] and done.info["prompt"] == raw["prompt"]
        seeds = [Image.open(p).getpixel((0, 0))[0] for p in done.paths]
        assert seeds == [(raw["seed"] + i) % 256 for i in range(raw.get("num_images", 1))]
        assert_progress([e for e in result if e.kind == "step"], raw["num_inference_steps"])
    assert max(len(s) for s in model.loop_steps) == 3  # all three shared steps


async def test_different_samplers_never_share_a_loop(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=8, step_joining=True)
    a = await _start(adapter, "a", scheduler="Euler a")
    await _loop_blocked_in(model, 1)
    passes: list[Any] = []
    schedule = adapter.scheduler.schedule

    def counted(**kw: Any) -> Any:
        passes.append(decided := schedule(**kw))
        return decided

    adapter.scheduler.schedule = counted
    b = await _start(adapter, "b", scheduler="DDIM")
    await wait_until(lambda: bool(passes), "the scheduler has looked at b while a's loop runs")
    running = adapter.scheduler.running
    if running is not None and "b" in [e.request.request_id for e in running.entries]:
        await _handed_to_model(adapter)  # taken into a's loop: it reaches the model before a ends
    steps.release(20)
    _ra, rb = await asyncio.gather(a, b)
    assert all(len(s) == 1 for s in model.loop_steps)
    assert rb[-1].info["joined_at_step"] == 0 and rb[-1].info["scheduler"] == "DDIM"


async def test_each_member_has_its_own_time_limit(make_adapter: Any) -> None:
    """a's limit runs out while b (joined later, short) finishes well within its own."""
    adapter, model = make_adapter(_joining(step_seconds=0.05), max_batch_size=4, step_joining=True, job_timeout=1.0)
    a = await _start(adapter, "a", num_inference_steps=50)  # 50 steps of 50 ms would be 2.5 s
    await wait_until(lambda: model.steps_run.get("a", 0) >= 2, "a runs")
    b = await _start(adapter, "b", num_inference_steps=3)
    rb = await b
    assert rb[-1].kind == "done" and rb[-1].info["joined_at_step"] >= 2
    with pytest.raises(JobTimedOut):
        await a
    assert model.steps_run["a"] < 50 and "a" not in model.decodes_by_id


async def test_step_joining_off_keeps_job_level_batching(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=4, step_joining=False)
    assert not adapter.step_joining
    a = await _start(adapter, "a", num_inference_steps=3)
    await wait_until(lambda: model.active == 1, "a runs")
    b = await _start(adapter, "b", num_inference_steps=3)
    steps.release(20)
    _ra, rb = await asyncio.gather(a, b)
    assert [job.request_id for job in model.calls] == ["a", "b"] and not model.loop_steps
    assert rb[-1].info["batching"] == "job" and rb[-1].info["joined_at_step"] is None
    assert model.max_active == 1


async def test_a_model_without_a_loop_keeps_job_level_batching(make_adapter: Any) -> None:
    adapter, _model = make_adapter(FakeModel(), max_batch_size=4, step_joining=True)
    assert not adapter.step_joining
    done = (await collect(adapter, raw_request()))[-1]
    assert done.info["batching"] == "job"


async def test_a_cancel_before_the_first_step_never_reaches_the_loop(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=1, step_joining=True)
    a = await _start(adapter, "a", num_inference_steps=3)
    await _loop_blocked_in(model, 1)
    b = await _start(adapter, "b", num_inference_steps=3)
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "b waits: no room")
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    steps.release(10)
    assert (await a)[-1].kind == "done"
    assert [job.request_id for job in model.calls] == ["a"]


async def test_a_joiner_is_sent_a_step_early_and_enters_as_the_leaving_member_goes(make_adapter: Any) -> None:
    """No step runs under-filled between a member's end and its successor's start: the joiner is sent
    to the model side when the member has one step left and is held there until its place is free."""
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(_joining(step_gate=steps), max_batch_size=1, step_joining=True)
    a = await _start(adapter, "a", num_inference_steps=4)
    await _loop_blocked_in(model, 1)
    b = await _start(adapter, "b", num_inference_steps=3)
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "b waits in line: no room")
    steps.release(3)  # a runs steps 1-3: one step left
    await _handed_to_model(adapter)  # b is sent ahead while a's last step waits for its permit
    assert model.loop_step_started == 4 and not a.done() and [j.request_id for j in model.calls] == ["a"]
    steps.release(10)
    ra, rb = await asyncio.gather(a, b)
    assert [_members(model, k) for k in range(1, 8)] == [["a"]] * 4 + [["b"]] * 3  # never 2 at once
    assert rb[-1].info["joined_at_step"] == 4  # the same loop, the boundary right after a's last step
    assert ra[-1].kind == "done" and ra[-1].info["batch_size"] == 1


def _submit_all(runner: Any, jobs: list[Any]) -> Any:
    """Queue ``jobs`` on the model thread at once; a queue of (request id, terminal event)."""
    import queue

    from pipeline.protocol import InferenceResult

    ends: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for job in jobs:
        runner.submit(
            job,
            threading.Event(),
            lambda e, r=job.request_id: ends.put((r, e)) if isinstance(e, InferenceResult) else None,
        )
    return ends


def test_the_model_side_follows_the_schedulers_tags_and_decides_nothing() -> None:
    """Issue 37: the model thread admits what the scheduler tagged for its running loop (``loop_id``),
    in the order sent, each once the members it names in ``enters_after`` have left, and runs anything
    else after the loop. It checks no room, memory or order of its own: b waits for a, c behind b."""
    import dataclasses

    from pipeline.engine.hosting.runner import ModelRunner
    from pipeline.protocol import InferenceJob

    steps = threading.Semaphore(0)
    model = _joining(step_gate=steps)
    runner = ModelRunner(lambda: model)
    runner.start(timeout=10)
    try:
        a = InferenceJob("a", ("p",), ("",), (1,), 64, 64, 3, 7.5, joinable=True, loop_id=7)
        jobs = [
            a,
            dataclasses.replace(a, request_id="b", seeds=(2,), num_inference_steps=2, enters_after=("a",)),
            dataclasses.replace(a, request_id="c", seeds=(3,), num_inference_steps=1),
            dataclasses.replace(a, request_id="d", seeds=(4,), num_inference_steps=1, loop_id=8),
        ]
        ends = _submit_all(runner, jobs)  # all queued before the first step
        steps.release(20)
        results = dict(ends.get(timeout=10) for _ in jobs)
    finally:
        runner.shutdown(timeout=10)
    assert [[rid for rid, _ in s] for s in model.loop_steps] == [["a"], ["a"], ["a"], ["b", "c"], ["b"], ["d"]]
    assert results["b"].joined_at_step == 3 and results["c"].joined_at_step == 3
    assert results["d"].joined_at_step == 0 and results["d"].batch_images == 1  # its own loop, after


@pytest.mark.parametrize(("total", "joins"), [(1000, False), (2000, True)])
async def test_a_joiner_that_would_not_fit_in_device_memory_waits_for_the_next_loop(
    make_adapter: Any, total: int, joins: bool
) -> None:
    """Issue 36 §5, decided by the scheduler (issue 37): the peak per image, measured on the jobs so
    far and reported by the model side with the device's total and idle bytes (100 idle, 300 an
    image here), decides whether a joiner fits beside a running loop: on a device of 1000 bytes a
    loop of 2 images (700) has no room for one more (1000 > 90 %), which runs next instead of
    failing them all; on 2000 bytes it joins."""
    steps = threading.Semaphore(0)
    model = _joining(step_gate=steps, memory=(total, 100), bytes_per_image=300)
    adapter, _ = make_adapter(model, max_batch_size=4, step_joining=True)
    steps.release(2)
    first = (await collect(adapter, raw_request(num_inference_steps=2), request_id="m"))[-1]
    assert first.kind == "done" and first.info["peak_memory_bytes"] == 400  # 300 an image at 64 x 64
    a = await _start(adapter, "a", num_inference_steps=3, num_images=2, seed=2)
    await _loop_blocked_in(model, 3)  # a new loop (loop steps count on), a's first step
    b = await _start(adapter, "b", num_inference_steps=2, seed=4)
    if joins:
        await _handed_to_model(adapter)
    else:
        await wait_until(lambda: adapter.gpu_queue_depth == 1, "b waits in line: no room in memory")
    steps.release(40)
    ra, rb = await asyncio.gather(a, b)
    assert ra[-1].kind == "done" and rb[-1].kind == "done"
    # Joined: beside a's two images (3 in the loop). Not: after a has left (never beside it).
    assert rb[-1].info["batch_size"] == (3 if joins else 1), rb[-1].info
    beside = max(sum({"a": 2, "b": 1}.get(rid, 0) for rid, _ in s) for s in model.loop_steps if s)
    assert beside == (3 if joins else 2)

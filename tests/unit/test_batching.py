"""Dynamic batching at the adapter, with a fake model: compatible waiting requests share one job.

Each test holds the first job in the model so the others line up at the gate, then releases it
and looks at the jobs the model received (``model.calls``). The gate tests in ``test_gate.py``
still hold: one job on the model at a time, whatever it carries.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pipeline.errors import OutOfMemory
from tests.fakes import FakeModel
from tests.helpers import assert_progress, collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


async def _line_up(
    adapter: Any, model: FakeModel, requests: list[tuple[str, dict[str, Any]]]
) -> list[asyncio.Task[Any]]:
    """Start a blocker job, then queue ``requests`` (id, raw) behind it in this order."""
    tasks = [asyncio.create_task(collect(adapter, raw_request(prompt="blocker"), request_id="blocker"))]
    await wait_until(lambda: model.active == 1, "the blocker is in the model")
    for i, (rid, raw) in enumerate(requests):
        tasks.append(asyncio.create_task(collect(adapter, raw, request_id=rid)))
        await wait_until(lambda: adapter.gpu_queue_depth == i + 1, f"{rid} waits at the gate")
    return tasks


async def _run_lined_up(adapter: Any, model: FakeModel, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Line ``requests`` up behind a blocker, then let every job through; the results, in order."""
    tasks = await _line_up(adapter, model, requests)
    for _ in range(len(requests) + 1):
        model.release.release()  # one permit per job at most; spare permits are never taken
    return await asyncio.gather(*tasks)


def _jobs(model: FakeModel) -> list[list[str]]:
    return [job.request_id.split(",") for job in model.calls]


def _pixel_seed(path: Any) -> int:
    from PIL import Image

    r, g, _ = Image.open(path).getpixel((0, 0))
    return r + (g << 8)


async def test_compatible_waiting_requests_share_one_job_and_keep_their_own_images(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=4)
    requests = [
        ("a", raw_request(prompt="a cat", negative_prompt="ugly", seed=11, num_images=1)),
        ("b", raw_request(prompt="a dog", negative_prompt="blurry", seed=22, num_images=2)),
        ("c", raw_request(prompt="a fish", negative_prompt="dark", seed=33, num_images=1)),
    ]
    tasks = await _line_up(adapter, model, requests)
    for _ in range(2):
        model.release.release()
    results = await asyncio.gather(*tasks)
    assert _jobs(model) == [["blocker"], ["a", "b", "c"]]
    job = model.calls[1]
    assert job.prompts == ("a cat", "a dog", "a dog", "a fish")
    assert job.negative_prompts == ("ugly", "blurry", "blurry", "dark")
    assert job.seeds == (11, 22, 23, 33)
    by_id = {rid: r[-1] for (rid, _), r in zip(requests, results[1:])}
    for rid, seeds in (("a", [11]), ("b", [22, 23]), ("c", [33])):
        done = by_id[rid]
        assert done.kind == "done"
        assert done.info["request_id"] == rid and done.info["seeds"] == seeds
        assert [_pixel_seed(p) for p in done.paths] == seeds  # its own images, in order
        assert done.info["batch_size"] == 4 and done.info["batch_requests"] == 3
    # Each request streamed its own progress, every step of the shared job.
    for result in results[1:]:
        assert_progress([e for e in result if e.kind == "step"], 4)
    assert results[0][-1].info["batch_size"] == 1


@pytest.mark.parametrize(
    "different",
    [
        {"width": 128},
        {"height": 128},
        {"num_inference_steps": 5},
        {"guidance_scale": 3.0},
        {"negative_prompt": "blurry"},
    ],
)
async def test_incompatible_requests_are_not_merged(make_adapter: Any, different: dict[str, Any]) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=8)
    requests = [("a", raw_request(seed=1)), ("b", raw_request(seed=2, **different)), ("c", raw_request(seed=3))]

    results = await _run_lined_up(adapter, model, requests)
    assert all(r[-1].kind == "done" for r in results)
    # a and c share a job; b differs in one compatibility field and runs on its own, next.
    assert _jobs(model) == [["blocker"], ["a", "c"], ["b"]]


async def test_only_requests_with_the_same_scheduler_share_a_job(make_adapter: Any) -> None:
    """Schedulers are per job (each job builds its own), so a job carries one scheduler for all its images."""
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=8)
    requests = [
        ("a", raw_request(seed=1, scheduler="DDIM")),
        ("b", raw_request(seed=2, scheduler="Euler a")),
        ("c", raw_request(seed=3, scheduler="DDIM")),
        ("d", raw_request(seed=4)),
    ]

    results = await _run_lined_up(adapter, model, requests)
    assert _jobs(model) == [["blocker"], ["a", "c"], ["b"], ["d"]]
    assert [job.sampler for job in model.calls] == ["default", "DDIM", "Euler a", "default"]
    # The info record names the sampler each request ran with ("default": the model's own, Euler here).
    assert [r[-1].info["scheduler"] for r in results[1:]] == ["DDIM", "Euler a", "DDIM", "Euler"]


async def test_the_head_of_the_line_always_goes_next(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=8)
    small, large = {"width": 64, "height": 64}, {"width": 128, "height": 128}
    requests = [
        ("s1", raw_request(**small)),
        ("l1", raw_request(**large)),
        ("s2", raw_request(**small)),
        ("l2", raw_request(**large)),
        ("s3", raw_request(**small)),
    ]

    await _run_lined_up(adapter, model, requests)
    # FIFO for the head: s1 leads, taking the later small ones; then l1, the oldest left, leads.
    assert _jobs(model) == [["blocker"], ["s1", "s2", "s3"], ["l1", "l2"]]


async def test_max_batch_size_bounds_the_images_in_a_job(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=3)
    requests = [
        ("a", raw_request(num_images=2)),
        ("b", raw_request(num_images=2)),
        ("c", raw_request(num_images=1)),
        ("d", raw_request(num_images=1)),
        ("e", raw_request(num_images=1)),
    ]

    await _run_lined_up(adapter, model, requests)
    assert all(job.num_images <= 3 for job in model.calls)
    # a (2) takes c (1): 3 images. b (2) then leads and takes d; e runs last.
    assert _jobs(model) == [["blocker"], ["a", "c"], ["b", "d"], ["e"]]


async def test_batch_size_one_turns_batching_off(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=1)
    requests = [(rid, raw_request()) for rid in "abc"]

    await _run_lined_up(adapter, model, requests)
    assert _jobs(model) == [["blocker"], ["a"], ["b"], ["c"]]


@pytest.mark.parametrize("victim", ["a", "b"])  # the head of the batch, and a request it took along
async def test_cancelling_one_member_does_not_fail_the_others(make_adapter: Any, victim: str) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(hold=True, step_gate=steps), max_batch_size=4)
    requests = [("a", raw_request(seed=1, num_inference_steps=6)), ("b", raw_request(seed=2, num_inference_steps=6))]
    for _ in range(4):
        steps.release()  # the blocker's steps
    tasks = await _line_up(adapter, model, requests)
    model.release.release()  # the blocker finishes; a and b start together
    await wait_until(lambda: len(model.calls) == 2, "the batch is in the model")
    steps.release()
    await wait_until(lambda: model.steps_run.get("a,b") == 1, "the batch ran a step")
    task = tasks[1 + "ab".index(victim)]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)  # it leaves at once, mid-job, head or not
    for _ in range(5):
        steps.release()
    model.release.release()
    survivor = await tasks[1 + "ab".index("b" if victim == "a" else "a")]
    assert survivor[-1].kind == "done" and len(survivor[-1].paths) == 1
    assert survivor[-1].info["steps_done"] == 6
    await tasks[0]
    # A new request waits for the batch: never two jobs at once.
    assert model.max_active == 1
    assert not model.stops["a,b"].is_set()  # the batch ran to the end for the survivor
    assert model.decodes_by_id["a,b"] == 1


async def test_cancelling_every_member_stops_the_batch_at_the_next_step(make_adapter: Any) -> None:
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(hold=True, step_gate=steps), max_batch_size=4)
    requests = [("a", raw_request(num_inference_steps=20)), ("b", raw_request(num_inference_steps=20))]
    for _ in range(4):
        steps.release()
    tasks = await _line_up(adapter, model, requests)
    model.release.release()
    await wait_until(lambda: len(model.calls) == 2, "the batch is in the model")
    steps.release()
    await wait_until(lambda: model.steps_run.get("a,b") == 1, "the batch ran a step")
    for task in tasks[1:]:
        task.cancel()
    await wait_until(lambda: model.stops["a,b"].is_set(), "the batch's stop is set")
    steps.release()  # the step in progress ends; the batch stops there
    for task in tasks[1:]:
        with pytest.raises(asyncio.CancelledError):
            await task
    await tasks[0]
    # The cancelled callers left at once; the batch's job ends on its own (asyncio.run used to wait for it).
    await wait_until(lambda: not adapter.inference_in_progress, "the stopped batch's job ends")
    assert model.steps_run["a,b"] == 2  # at most one more step after the stop
    assert "a,b" not in model.decodes_by_id  # no decode for a job nobody wants


async def test_out_of_memory_in_a_batch_is_retried_one_request_at_a_time(make_adapter: Any) -> None:
    def outcome(job: Any) -> None:
        if job.num_images > 1 or job.request_id == "c":
            raise MemoryError("fake OOM")

    adapter, model = make_adapter(FakeModel(hold=True, outcome=outcome), max_batch_size=4)
    requests = [(rid, raw_request(seed=i)) for i, rid in enumerate("abc")]
    tasks = await _line_up(adapter, model, requests)
    for _ in range(5):
        model.release.release()
    a, b, c = await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert _jobs(model) == [["blocker"], ["a", "b", "c"], ["a"], ["b"], ["c"]]
    assert a[-1].kind == "done" and b[-1].kind == "done"
    assert a[-1].info["batch_size"] == 1
    assert isinstance(c, OutOfMemory) and "c" in str(c)  # alone it still does not fit: its own error
    assert "oom_batch_retries_total 1.0" in adapter.metrics.render().decode()

"""A per-identity budget of images per hour (``--quota-images-per-hour``, ``serving.quota``).

Counted in the adapter's ``run``, where every protocol enters: a request's images are taken when it
is accepted, spent once its job has run a step, and given back only if it ends before that. The protocols themselves (page, gradio_client,
MCP, /sdapi/v1, /v1/images) are counted together in tests/server/test_peer_apis.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pipeline.errors import InvalidRequest, QuotaExceeded
from pipeline.serving.quota import HOUR, ImageQuota
from tests.fakes import FakeModel
from tests.helpers import collect, raw_request, wait_until

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def test_a_sliding_hour_per_identity_says_when_the_next_images_fit() -> None:
    clock = Clock()
    quota = ImageQuota(5, clock)
    with quota.held("alice", 3) as held:
        held.keep()
    clock.now += 600
    with quota.held("alice", 2) as held:
        held.keep()
    with pytest.raises(QuotaExceeded) as refused:
        with quota.held("alice", 1):
            pass
    assert refused.value.retry_after == pytest.approx(HOUR - 600)  # when the first 3 age out
    assert "5 of your 5 images in the last hour; 1 more image fit in 50 min" in str(refused.value)
    with quota.held("bob", 5) as held:  # another identity has its own hour
        held.keep()
    clock.now += HOUR - 600
    assert quota.used("alice") == 2
    with quota.held("alice", 3) as held:
        held.keep()


def test_images_not_delivered_are_given_back() -> None:
    quota = ImageQuota(2, Clock())
    with pytest.raises(RuntimeError):
        with quota.held("alice", 2):
            raise RuntimeError("refused later, cancelled or failed")
    assert quota.used("alice") == 0
    with pytest.raises(GeneratorExit):
        with quota.held("alice", 2) as held:
            held.keep()  # delivered, then the caller closed the stream: still counted
            raise GeneratorExit
    assert quota.used("alice") == 2
    with quota.held(None, 10**6):  # no identity (a direct call): not counted
        pass


async def test_the_adapter_refuses_past_the_quota_before_any_gpu_work(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(), max_batch_size=1)
    adapter.quota = ImageQuota(3)
    out = await collect(adapter, raw_request(num_images=2), user="alice")
    assert out[-1].kind == "done" and adapter.quota.used("alice") == 2
    calls = len(model.calls)
    with pytest.raises(QuotaExceeded, match="2 of your 3 images"):
        await collect(adapter, raw_request(num_images=2), user="alice")
    assert len(model.calls) == calls  # refused before the model saw it
    await collect(adapter, raw_request(num_images=3), user="bob")
    await collect(adapter, raw_request(num_images=1), user="alice")  # what fits still runs


async def test_a_request_that_leaves_before_its_first_step_gets_its_images_back(make_adapter: Any) -> None:
    gate = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=gate), max_batch_size=1)
    adapter.quota = ImageQuota(4)
    task = asyncio.create_task(collect(adapter, raw_request(num_images=2), user="alice"))
    await wait_until(lambda: model.active == 1, "the job is in the model, before its first step")
    assert adapter.quota.used("alice") == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adapter.quota.used("alice") == 0
    for _ in range(8):
        gate.release()
    await wait_until(lambda: model.active == 0, "the stopped job has left the model")


async def test_a_request_that_ran_a_step_has_spent_its_images_whatever_ends_it(make_adapter: Any) -> None:
    """The quota bounds work: a caller that stops at a step it has seen (an interrupt at the last step
    after reading the preview, a dropped stream) has had the work done for it."""
    gate = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(step_gate=gate), max_batch_size=1)
    adapter.quota = ImageQuota(4)
    events = adapter.run(raw_request(num_images=2, num_inference_steps=4), user="alice")
    gate.release()  # one step runs
    async for event in events:
        if event.kind == "step":
            assert event.step == 1
            break
    await events.aclose()  # the caller leaves at step 1 of 4
    assert adapter.quota.used("alice") == 2
    for _ in range(8):
        gate.release()
    await wait_until(lambda: model.active == 0, "the stopped job has left the model")
    with pytest.raises(QuotaExceeded):
        await collect(adapter, raw_request(num_images=3), user="alice")


async def test_a_request_larger_than_the_whole_quota_is_refused_by_name(make_adapter: Any) -> None:
    adapter, _model = make_adapter(FakeModel(), max_batch_size=1)
    adapter.quota = ImageQuota(3)
    with pytest.raises(InvalidRequest, match="num_images must be at most 3: the quota") as refused:
        await collect(adapter, raw_request(num_images=4), user="alice")
    assert refused.value.field == "num_images"
    assert adapter.quota.used("alice") == 0

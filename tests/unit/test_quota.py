"""A per-identity budget of images per hour (``--quota-images-per-hour``, ``serving.quota``).

Counted in the adapter's ``run``, where every protocol enters: a request's images are taken when it
is accepted and given back if it ends without them. The protocols themselves (page, gradio_client,
MCP, /sdapi/v1, /v1/images) are counted together in tests/server/test_peer_apis.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.errors import QuotaExceeded
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


async def test_a_cancelled_request_gives_its_images_back(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(hold=True), max_batch_size=1)
    adapter.quota = ImageQuota(2)
    task = asyncio.create_task(collect(adapter, raw_request(num_images=2), user="alice"))
    await wait_until(lambda: model.active == 1, "the job is in the model")
    assert adapter.quota.used("alice") == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    model.release.release()
    assert adapter.quota.used("alice") == 0

"""Rejection before the queue: Gradio's ``validator=`` answers a bad request at join time.

Without it a request that validation rejects waits for a handler slot (``--concurrency``) behind
the running jobs. The handler keeps its own validation as a backstop, with the same messages.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from pipeline.errors import InvalidRequest
from pipeline.request import FIELDS, Limits, validate
from pipeline.serving.metrics import Metrics
from pipeline.web.handler import make_validator
from tests.fakes import FAKE_PROFILE, WAIT, FakeModel
from tests.helpers import api_fn_index, queue_call, raw_request, running_app, wait_for

WIDTH_RANGE = "width must be a multiple of 8 between 64 and 512; got 7"  # FakeModel's limits


class _Adapter:
    """What the validator reads of an adapter: its limits and its metrics."""

    def __init__(self) -> None:
        self.limits = Limits.for_model(FAKE_PROFILE)
        self.metrics = Metrics(lambda: 0.0, lambda: 0.0)


def _rejected(adapter: _Adapter) -> float:
    value = adapter.metrics.registry.get_sample_value("jobs_total", {"outcome": "rejected"})
    assert value is not None
    return value


@pytest.mark.anyio
async def test_the_validator_gives_the_handlers_message_at_the_bad_field_only() -> None:
    adapter = _Adapter()
    check = make_validator(adapter)
    bad = {**raw_request(width=7), "live_preview": False}
    results = await check(*(bad[f] for f in FIELDS))
    with pytest.raises(InvalidRequest) as handler_error:
        validate(bad, adapter.limits)
    assert str(handler_error.value) == WIDTH_RANGE
    assert [(r["is_valid"], r["message"]) for r in results] == [
        (f != "width", WIDTH_RANGE if f == "width" else "") for f in FIELDS
    ]
    assert all(r["__type__"] == "validate" for r in results)
    assert _rejected(adapter) == 1

    good = {**raw_request(), "live_preview": False}
    assert all(r["is_valid"] for r in await check(*(good[f] for f in FIELDS)))
    assert _rejected(adapter) == 1


@pytest.mark.server
def test_a_rejected_request_is_answered_while_every_handler_slot_is_busy(tmp_path: Path) -> None:
    from gradio_client import Client
    from gradio_client.exceptions import ValidationError

    # Each step waits for a permit (steps block, in the model thread) until the end of the test.
    model = FakeModel(step_gate=threading.Semaphore(0), permit_wait=4 * WAIT)
    args = ("--model-side", "thread", "--concurrency", "2", "--max-batch-size", "1")
    with running_app(tmp_path, *args, load=lambda: model) as (url, _demo, _adapter):
        health = lambda: httpx.get(url + "health", timeout=10).json()  # noqa: E731
        long_jobs = [
            Client(url, verbose=False).submit(**raw_request(seed=i, num_inference_steps=3), api_name="/generate")
            for i in range(2)
        ]
        # Both handler slots are taken: one job in the model (blocked in its first step), one
        # waiting for the GPU gate; a third waits in Gradio's queue for a slot.
        wait_for(lambda: health()["requests_in_flight"] == 2 and len(model.calls) == 1, "both slots are busy")
        queued = Client(url, verbose=False).submit(**raw_request(seed=9), api_name="/generate")
        wait_for(lambda: health()["queue_depth"] == 2, "one in Gradio's queue, one waiting for the GPU")

        bad = Client(url, verbose=False).submit(**raw_request(width=7), api_name="/generate")
        # A bound against a hang, not a timing assertion: without the validator the answer can
        # only come once a slot frees up, and no slot frees up before the permits below.
        wait_for(bad.done, "the bad request is answered while every slot is busy", timeout=WAIT)
        with pytest.raises(ValidationError) as info:
            bad.result(timeout=WAIT)
        assert str(info.value) == f"1 parameter(s) failed validation:\n- width: {WIDTH_RANGE}"

        # The answer came while the slots were still busy: nothing has moved since.
        assert health()["requests_in_flight"] == 2 and health()["queue_depth"] == 2
        assert not any(job.done() for job in [*long_jobs, queued])
        assert len(model.calls) == 1 and model.steps_run == {}, "the long jobs are still in their first step"
        rejected = httpx.get(url + "metrics", timeout=10).text
        assert 'jobs_total{outcome="rejected"} 1.0' in rejected

        model.step_gate.release(100)
        results = [job.result(timeout=WAIT) for job in [*long_jobs, queued]]
        assert [info["status"] for _, info in results] == ["done"] * 3
        assert len(model.calls) == 3, "the rejected request never reached the model"


@pytest.mark.server
def test_raw_http_join_is_refused_with_422_naming_the_field(tmp_path: Path) -> None:
    model = FakeModel()
    with running_app(tmp_path, "--model-side", "thread", load=lambda: model) as (url, _demo, _adapter):
        data = [{**raw_request(num_inference_steps=0), "live_preview": False}[f] for f in FIELDS]
        answer = queue_call(url, api_fn_index(url), data)
        assert answer["success"] is False and answer["status_code"] == 422
        detail = json.loads(answer["output"]["error"])["detail"]
        refused = [(d["parameter_name"], d["message"]) for d in detail if not d["is_valid"]]
        assert refused == [
            ("num_inference_steps", "num_inference_steps must be a whole number between 1 and 50; got 0")
        ]
        assert model.calls == []

"""Rejection before the queue in the launched app: a request that validation rejects is answered at
join time, by name, even while the app's line is full (the validator's own messages are in
``tests/unit/test_validator.py``)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from pipeline.request import FIELDS
from tests.fakes import FAKE_WIDTH_ERROR, WAIT, FakeModel
from tests.helpers import api_fn_index, queue_call, raw_request, running_app, wait_for


def test_a_rejected_request_is_answered_by_name_while_the_line_is_full(tmp_path: Path) -> None:
    """The app holds ``--concurrency`` + ``--queue-size`` requests (issue 47: all in its fair line);
    with the line full, a good request is told "queue full", and a bad one is still told what is
    wrong with it, at join, naming the field, without reaching the handler or the model."""
    from gradio_client import Client
    from gradio_client.exceptions import ValidationError

    # Each step waits for a permit (steps block, in the model thread) until the end of the test.
    model = FakeModel(step_gate=threading.Semaphore(0), permit_wait=4 * WAIT)
    args = ("--model-side", "thread", "--concurrency", "2", "--queue-size", "1", "--max-batch-size", "1",
            "--max-waiting-per-user", "5")  # fmt: skip
    with running_app(tmp_path, *args, load=lambda: model) as (url, _demo, _adapter):
        health = lambda: httpx.get(url + "health", timeout=10).json()  # noqa: E731
        long_jobs = [
            Client(url, verbose=False).submit(**raw_request(seed=i, num_inference_steps=3), api_name="/generate")
            for i in range(3)
        ]
        # The line is full: one job in the model (blocked in its first step), two waiting for the GPU.
        wait_for(lambda: health()["requests_in_flight"] == 3 and len(model.calls) == 1, "the line is full")
        wait_for(lambda: health()["gpu_queue_depth"] == 2, "two wait in the fair line, none in Gradio's queue")
        with pytest.raises(Exception, match="(?i)queue is full"):
            Client(url, verbose=False).predict(**raw_request(seed=9), api_name="/generate")

        bad = Client(url, verbose=False).submit(**raw_request(width=7), api_name="/generate")
        wait_for(bad.done, "the bad request is answered", timeout=WAIT)
        with pytest.raises(ValidationError) as info:
            bad.result(timeout=WAIT)
        assert str(info.value) == f"1 parameter(s) failed validation:\n- width: {FAKE_WIDTH_ERROR}"

        # Nothing has moved since: the refusals took no place and reached no model.
        assert health()["requests_in_flight"] == 3 and health()["queue_depth"] == 2
        assert not any(job.done() for job in long_jobs)
        assert len(model.calls) == 1 and model.steps_run == {}, "the long jobs are still in their first step"
        rejected = httpx.get(url + "metrics", timeout=10).text
        assert 'jobs_total{outcome="rejected"} 2.0' in rejected  # queue full, and the bad request

        model.step_gate.release(100)
        results = [job.result(timeout=WAIT) for job in long_jobs]
        assert [info["status"] for _, info in results] == ["done"] * 3
        assert len(model.calls) == 3, "the rejected requests never reached the model"


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

"""Progress, cancel, disconnect, health and metrics through the launched app (fake model inside)."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any, Iterator

import httpx
import pytest

from pipeline.request import FIELDS
from tests.fakes import WAIT, FakeModel
from tests.helpers import raw_request, wait_for

PARAMS = list(FIELDS)  # the API's positional order (tests/server/test_app_client.py pins it)


@pytest.fixture(scope="module")
def served(fake: FakeModel, launch: Any) -> tuple[str, Any, Any]:
    return launch(load=lambda: fake, name="lifecycle")


@pytest.fixture(scope="module")
def url(served: tuple[str, Any, Any]) -> str:
    return served[0]


@pytest.fixture(autouse=True)
def _free_steps(fake: FakeModel) -> Iterator[None]:
    fake.step_gate = None
    yield
    fake.step_gate = None


def metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def test_client_follows_progress_in_order_to_n_of_n(client: Any) -> None:
    job = client.submit(**raw_request(num_inference_steps=6), api_name="/generate")
    gallery, info = job.result(timeout=WAIT)
    records = [out[1] for out in job.outputs()]
    running = [(r["step"], r["total"]) for r in records if r.get("status") == "running"]
    # In order, ending at N/N (intermediate steps are streamed at most every 0.1 s).
    assert running and running[-1] == (6, 6) and all(t == 6 for _, t in running)
    assert [s for s, _ in running] == sorted(set(s for s, _ in running))
    assert records[0]["status"] == "waiting" and records[-1]["status"] == "done"
    assert info["status"] == "done" and len(gallery) == 1
    assert job.status().progress_data is None or all(p.index <= 6 for p in job.status().progress_data)


def test_health_reports_idle_then_busy(url: str, fake: FakeModel, client: Any) -> None:
    body = httpx.get(url + "health", timeout=10).json()
    assert body["status"] == "ok" and body["model"] == "fake-model"
    assert body["queue_depth"] == 0 and body["inference_in_progress"] is False
    fake.step_gate = threading.Semaphore(0)
    job = client.submit(**raw_request(num_inference_steps=3, seed=11), api_name="/generate")
    wait_for(lambda: httpx.get(url + "health").json()["inference_in_progress"], "inference shows in /health")
    assert httpx.get(url + "health").json()["status"] == "busy"
    fake.step_gate.release(3)
    job.result(timeout=WAIT)


def test_metrics_count_completed_cancelled_and_rejected(url: str, fake: FakeModel, client: Any) -> None:
    from gradio_client.exceptions import ValidationError

    before = {
        o: metric(url, "jobs_total", f'{{outcome="{o}"}}') for o in ("completed", "cancelled", "rejected", "failed")
    }
    steps_before = metric(url, "denoise_steps_total")

    client.predict(**raw_request(num_inference_steps=4, seed=21), api_name="/generate")  # completed: 4 steps

    with pytest.raises(ValidationError, match="width must be"):  # rejected
        client.predict(**raw_request(width=65), api_name="/generate")

    fake.step_gate = threading.Semaphore(0)  # cancelled, via gradio_client's job.cancel()
    job = client.submit(**raw_request(num_inference_steps=50, seed=22), api_name="/generate")
    fake.step_gate.release(2)
    wait_for(lambda: fake.steps_run.get(_last_id(fake)) == 2 and fake.calls[-1].seeds == (22,), "two steps ran")
    victim = _last_id(fake)
    # The /cancel request returns once the job has really stopped, so it is sent from a thread.
    canceller = threading.Thread(target=job.cancel)
    canceller.start()
    wait_for(lambda: fake.stops[victim].is_set(), "the cancel reached the model thread")
    fake.step_gate.release(50)
    canceller.join(WAIT)
    wait_for(lambda: metric(url, "jobs_total", '{outcome="cancelled"}') > before["cancelled"], "cancel counted")
    wait_for(lambda: not httpx.get(url + "health").json()["inference_in_progress"], "the gate is free")

    after = {o: metric(url, "jobs_total", f'{{outcome="{o}"}}') for o in before}
    assert {o: after[o] - before[o] for o in before} == {"completed": 1, "cancelled": 1, "rejected": 1, "failed": 0}
    ran = fake.steps_run[_last_id(fake)]
    assert ran <= 3, f"{ran} steps ran; the cancel came after step 2"
    assert metric(url, "denoise_steps_total") - steps_before == 4 + ran
    assert metric(url, "inference_seconds_count") >= 1 and metric(url, "gate_wait_seconds_count") >= 1
    assert metric(url, "gpu_queue_depth") == 0 and metric(url, "inference_in_progress") == 0


def test_cancel_while_waiting_leaves_without_touching_the_model(url: str, fake: FakeModel, client: Any) -> None:
    from gradio_client import Client

    # Gradio cancels by (session, endpoint): the waiting job comes from a second caller, so that
    # cancelling it cannot touch the first caller's running job.
    other = Client(url, verbose=False)
    fake.step_gate = threading.Semaphore(0)
    # The first job holds the model, waiting for step permits, for the whole set-up below (three
    # waits of up to WAIT each on a loaded machine): its own permit wait must outlast them, or it
    # fails with "step permit never came" while nothing is wrong (seen twice under a full suite
    # running beside a training job).
    fake.permit_wait = 4 * WAIT
    started = time.monotonic()
    try:
        first = client.submit(**raw_request(num_inference_steps=2, seed=31), api_name="/generate")
        wait_for(lambda: fake.calls and fake.calls[-1].seeds == (31,) and fake.active == 1, "the first job runs")
        second = other.submit(**raw_request(num_inference_steps=2, seed=32), api_name="/generate")
        wait_for(lambda: httpx.get(url + "health").json()["gpu_queue_depth"] == 1, "the second waits for the GPU")
        calls = len(fake.calls)
        # gradio_client's cancel sends /reset only once its thread has read the event id from the
        # join's answer; cancelled before that (a loaded machine: the in-process server got there
        # first), it sends nothing and the job is never cancelled (seen once in a full CI run)
        wait_for(lambda: second.communicator is not None and second.communicator.event_id, "the client knows the event")
        second.cancel()
        wait_for(lambda: httpx.get(url + "health").json()["gpu_queue_depth"] == 0, "the second left the line")
        setup = time.monotonic() - started
        fake.step_gate.release(2)
        info = first.result(timeout=WAIT)[1]
    finally:
        fake.permit_wait = WAIT
    assert info["status"] == "done", f"set-up took {setup:.1f} s"  # the other caller's job was untouched
    assert len(fake.calls) == calls and all(c.seeds != (32,) for c in fake.calls)


def test_a_dropped_connection_stops_the_job(url: str, fake: FakeModel, served: tuple[str, Any, Any]) -> None:
    """A raw HTTP client joins the queue, reads progress, then drops the connection mid-job."""
    config = httpx.get(url + "config", timeout=10).json()
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")
    session = uuid.uuid4().hex[:10]
    data = [raw_request(num_inference_steps=40, seed=41, live_preview=False)[p] for p in PARAMS]
    fake.step_gate = threading.Semaphore(0)
    joined = httpx.post(
        url + "gradio_api/queue/join", timeout=10, json={"data": data, "fn_index": fn_index, "session_hash": session}
    )
    assert joined.status_code == 200, joined.text
    with httpx.stream("GET", url + f"gradio_api/queue/data?session_hash={session}", timeout=WAIT) as stream:
        fake.step_gate.release(3)
        seen = []
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "progress":  # gr.Progress: {"index": step, "length": total, ...}
                seen.append(message["progress_data"][0]["index"])
                if seen[-1] == 3:
                    break
    assert seen[-1:] == [3], f"never saw step 3: {message}"
    # The connection closed after step 3, while the model thread waits to run step 4 (in a real
    # pipeline: while step 4 computes). The server must notice with no further step running.
    victim = _last_id(fake)
    assert fake.calls[-1].seeds == (41,)
    wait_for(lambda: fake.stops[victim].is_set(), "the disconnect reached the model thread", timeout=10)
    assert fake.steps_run[victim] == 3
    fake.step_gate.release(40)
    wait_for(lambda: victim in fake.returned, "the model thread returned")
    assert fake.steps_run[victim] <= 4, f"{fake.steps_run[victim] - 3} steps ran after the disconnect"
    assert fake.decodes_by_id.get(victim) is None
    wait_for(lambda: not httpx.get(url + "health").json()["inference_in_progress"], "the gate is free")


def _last_id(fake: FakeModel) -> str:
    return fake.calls[-1].request_id


def test_progress_outputs_never_rebuild_a_component(
    served: tuple[str, Any, Any], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prop update (``gr.skip()``, ``gr.update()``) makes Gradio rebuild the component and its JSON
    schema on the event loop; progress outputs must not send one (issue 5: half the loop's GIL time)."""
    import gradio.state_holder

    from pipeline.web.gradio_internals import QUEUE_POLL_SECONDS

    rebuilt: list[int] = []
    original = gradio.state_holder.SessionState._update_config

    def counting(self: Any, key: int) -> None:
        rebuilt.append(key)
        original(self, key)

    monkeypatch.setattr(gradio.state_holder.SessionState, "_update_config", counting)
    job = client.submit(**raw_request(num_inference_steps=8, live_preview=False), api_name="/generate")
    job.result(timeout=WAIT)
    assert len([o for o in job.outputs() if o[1].get("status") in ("waiting", "running")]) >= 2
    assert rebuilt == []
    # And Gradio's idle polling is slowed from 1 ms to QUEUE_POLL_SECONDS.
    queue = served[1]._queue
    assert queue.sleep_when_free == QUEUE_POLL_SECONDS and queue.progress_update_sleep_when_free >= 0.1

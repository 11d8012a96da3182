"""Fault injection through the launched app: each fault gets the right message and the next request works."""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Iterator

import httpx
import pytest

from pipeline.protocol import InferenceJob
from tests.fakes import WAIT, FakeModel
from tests.helpers import raw_request, running_app


@pytest.fixture(scope="module")
def app(fake: FakeModel, launch: Any) -> tuple[str, Any, Any]:
    return launch("--job-timeout", "1", load=lambda: fake, name="faults")


@pytest.fixture(scope="module")
def url(app: tuple[str, Any, Any]) -> str:
    return app[0]


@pytest.fixture(autouse=True)
def _fake_reset(fake: FakeModel) -> Iterator[None]:
    fake.outcome, fake.hold = None, False
    yield
    fake.outcome, fake.hold = None, False


def _ok(client: Any, seed: int = 1) -> dict[str, Any]:
    _, info = client.predict(**raw_request(seed=seed), api_name="/generate")
    assert info["status"] == "done"
    return info


def _raise(exc: BaseException) -> Any:
    def outcome(job: InferenceJob) -> None:
        raise exc

    return outcome


def test_a_pipeline_exception_gives_a_generic_message_with_the_request_id(
    client: Any, fake: FakeModel, caplog: pytest.LogCaptureFixture
) -> None:
    from gradio_client.exceptions import AppError

    fake.outcome = _raise(RuntimeError("secret internal detail"))
    with caplog.at_level(logging.ERROR), pytest.raises(AppError) as info:
        client.predict(**raw_request(), api_name="/generate")
    message = str(info.value)
    request_id = re.search(r"request id ([0-9a-f]{12})", message).group(1)
    assert "internal error" in message and "secret internal detail" not in message
    # The traceback goes to the log only (as text: the model side reports errors as plain data).
    assert any(
        request_id in r.getMessage() and "Traceback" in r.getMessage() and "secret internal detail" in r.getMessage()
        for r in caplog.records
    )
    fake.outcome = None
    _ok(client)


def test_out_of_memory_tells_the_user_to_shrink_and_keeps_serving(client: Any, fake: FakeModel) -> None:
    from gradio_client.exceptions import AppError

    fake.outcome = _raise(MemoryError())
    with pytest.raises(AppError, match="Out of memory.*smaller width and height, or fewer images"):
        client.predict(**raw_request(), api_name="/generate")
    fake.outcome = None
    _ok(client)


def test_three_failures_in_a_row_make_health_degraded(client: Any, fake: FakeModel, app: tuple[str, Any, Any]) -> None:
    from gradio_client.exceptions import AppError

    url = app[0]
    fake.outcome = _raise(RuntimeError("boom"))
    for i in range(3):
        assert httpx.get(url + "health").json()["status"] == "ok"
        with pytest.raises(AppError):
            client.predict(**raw_request(seed=i), api_name="/generate")
    assert httpx.get(url + "health").json()["status"] == "degraded"
    fake.outcome = None
    _ok(client)
    assert httpx.get(url + "health").json()["status"] == "ok"


def test_a_hung_job_ends_with_a_clear_error_at_the_time_limit(
    client: Any, fake: FakeModel, app: tuple[str, Any, Any]
) -> None:
    from gradio_client.exceptions import AppError

    url = app[0]
    fake.hold = True  # the model blocks until released: a hang
    with pytest.raises(AppError, match=r"ran past the 1 s time limit.*request id"):
        client.predict(**raw_request(), api_name="/generate")
    assert httpx.get(url + "health").json()["model_hung"] is True
    fake.hold = False
    fake.release.release()  # the stuck call returns at last
    _ok(client)
    health = httpx.get(url + "health").json()
    assert health["model_hung"] is False and health["status"] == "ok"


def test_a_dead_model_thread_fails_every_waiting_job_and_health_says_dead(tmp_path: Any) -> None:
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    model = FakeModel(hold=True, outcome=_raise(SystemExit("the model thread dies")))
    with running_app(tmp_path, load=lambda: model) as (url, _demo, _adapter):
        clients = [Client(url, verbose=False) for _ in range(3)]
        jobs = [c.submit(**raw_request(seed=i), api_name="/generate") for i, c in enumerate(clients)]
        deadline = time.monotonic() + WAIT
        while httpx.get(url + "health").json()["requests_in_flight"] < 3:
            assert time.monotonic() < deadline, "three jobs never got in"
            time.sleep(0.01)
        model.release.release()
        for job in jobs:
            with pytest.raises(AppError, match="model thread has stopped"):
                job.result(timeout=WAIT)
        response = httpx.get(url + "health")
        assert response.status_code == 503 and response.json()["status"] == "dead"
        with pytest.raises(AppError, match="model thread has stopped"):  # and later ones, at once
            clients[0].predict(**raw_request(), api_name="/generate")

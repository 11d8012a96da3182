"""The model thread: named, one job at a time, exactly one reply per job, failures contained."""

from __future__ import annotations

import threading

import pytest

from pipeline.errors import EngineDead
from pipeline.worker import GpuWorker
from tests.fakes import FAKE_PROFILE, WAIT, FakeModel
from pipeline.protocol import InferenceJob

JOB = InferenceJob("j", ("p",), ("",), (1,), 64, 64, 2, 7.5)


def test_model_is_loaded_and_run_on_the_named_thread() -> None:
    threads: list[str] = []

    class Recording(FakeModel):
        def generate(self, job, stop, on_step):  # type: ignore[no-untyped-def]
            threads.append(threading.current_thread().name)
            return super().generate(job, stop, on_step)

    def load() -> FakeModel:
        threads.append(threading.current_thread().name)
        return Recording()

    worker = GpuWorker(load)
    assert worker.start(timeout=WAIT) == FAKE_PROFILE
    assert worker.submit(JOB, threading.Event(), lambda *_: None).result(WAIT).steps_done == 2
    worker.shutdown(timeout=WAIT)
    assert threads == ["gpu-worker", "gpu-worker"]
    assert not worker.alive


def test_a_failing_job_does_not_stop_the_thread() -> None:
    model = FakeModel()
    worker = GpuWorker(lambda: model)
    worker.start(timeout=WAIT)

    def boom(job: InferenceJob) -> None:
        raise RuntimeError("boom")

    model.outcome = boom
    with pytest.raises(RuntimeError, match="boom"):
        worker.submit(JOB, threading.Event(), lambda *_: None).result(WAIT)
    model.outcome = None
    assert worker.submit(JOB, threading.Event(), lambda *_: None).result(WAIT).images
    worker.shutdown(timeout=WAIT)


def test_a_dying_thread_fails_the_running_and_every_waiting_job() -> None:
    model = FakeModel(hold=True)
    worker = GpuWorker(lambda: model)
    worker.start(timeout=WAIT)

    def die(job: InferenceJob) -> None:
        raise SystemExit("the thread dies")

    model.outcome = die
    running = worker.submit(JOB, threading.Event(), lambda *_: None)
    assert model.entered.wait(WAIT)
    waiting = [worker.submit(JOB, threading.Event(), lambda *_: None) for _ in range(3)]
    model.release.release()
    for future in [running, *waiting]:
        with pytest.raises(EngineDead):
            future.result(WAIT)
    assert not worker.alive
    with pytest.raises(EngineDead):
        worker.submit(JOB, threading.Event(), lambda *_: None).result(WAIT)


def test_a_failed_load_is_reported_by_start() -> None:
    def load() -> FakeModel:
        raise OSError("no such model")

    with pytest.raises(EngineDead, match="no such model"):
        GpuWorker(load).start(timeout=WAIT)

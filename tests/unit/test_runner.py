"""The model side: one named thread, one job at a time, a stream of plain data with exactly one end."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest

from pipeline.engine.hosting import runner as runner_module
from pipeline.engine.hosting.runner import ModelRunner, install, run_job
from pipeline.errors import EngineDead
from pipeline.protocol import EncodedPreview, InferenceJob, InferenceResult, StepEvent
from tests.fakes import FAKE_PROFILE, WAIT, FakeModel

JOB = InferenceJob("j", ("p",), ("",), (1,), 64, 64, 2, 7.5)


def in_thread(stream: Any) -> tuple[threading.Thread, list[Any]]:
    """Iterate a stream on its own thread (the serving side's model-stream thread does this)."""
    events: list[Any] = []
    thread = threading.Thread(target=lambda: events.extend(stream), daemon=True)
    thread.start()
    return thread, events


def test_model_is_loaded_and_run_on_the_named_thread() -> None:
    threads: list[str] = []

    class Recording(FakeModel):
        def generate(self, job, stop, on_step):
            threads.append(threading.current_thread().name)
            return super().generate(job, stop, on_step)

    def load() -> FakeModel:
        threads.append(threading.current_thread().name)
        return Recording()

    runner = ModelRunner(load)
    assert runner.start(timeout=WAIT) == FAKE_PROFILE
    events = list(runner.stream(JOB))
    assert [(e.step, e.total) for e in events[:-1]] == [(1, 2), (2, 2)]
    assert isinstance(events[-1], InferenceResult) and events[-1].steps_done == 2
    runner.shutdown(timeout=WAIT)
    assert threads == ["gpu-worker", "gpu-worker"]
    assert not runner.alive


def test_every_event_and_the_job_cross_a_process_boundary_as_plain_data() -> None:
    """What ZeroGPU, a Ray replica or a model process pickle: the job in, every event out."""
    model = FakeModel(previews=True)
    runner = ModelRunner(lambda: model)
    runner.start(timeout=WAIT)
    job = InferenceJob("j", ("p",), ("",), (1,), 64, 64, 3, 7.5, preview_every=1)
    assert pickle.loads(pickle.dumps(job)) == job
    events = [pickle.loads(pickle.dumps(e)) for e in runner.stream(job)]
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == 3 and all(isinstance(s.preview(0), EncodedPreview) for s in steps)  # JPEG, made here
    assert isinstance(events[-1], InferenceResult) and events[-1].images[0].size == (64, 64)
    failing = FakeModel(outcome=lambda job: (_ for _ in ()).throw(RuntimeError("boom")))
    other = ModelRunner(lambda: failing)
    other.start(timeout=WAIT)
    error = pickle.loads(pickle.dumps(list(other.stream(JOB))[-1]))
    assert isinstance(error, InferenceResult) and error.reason == "failed" and "boom" in error.message
    runner.shutdown(timeout=WAIT)
    other.shutdown(timeout=WAIT)


def test_a_failing_job_does_not_stop_the_thread() -> None:
    model = FakeModel()
    runner = ModelRunner(lambda: model)
    runner.start(timeout=WAIT)

    def boom(job: InferenceJob) -> None:
        raise RuntimeError("boom")

    model.outcome = boom
    end = list(runner.stream(JOB))[-1]
    assert isinstance(end, InferenceResult) and end.reason == "failed" and "RuntimeError: boom" in end.message
    assert "Traceback" in end.detail
    model.outcome = None
    assert isinstance(list(runner.stream(JOB))[-1], InferenceResult)
    runner.shutdown(timeout=WAIT)


def test_closing_the_stream_stops_the_job_at_the_next_step_and_waits_for_the_thread() -> None:
    steps = threading.Semaphore(0)
    model = FakeModel(step_gate=steps)
    runner = ModelRunner(lambda: model)
    runner.start(timeout=WAIT)
    stream = runner.stream(InferenceJob("victim", ("p",), ("",), (1,), 64, 64, 20, 7.5))
    steps.release(3)
    seen = [next(stream).step for _ in range(3)]
    closer = threading.Thread(target=stream.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close returned while the model thread was still inside step 4"
    steps.release()  # step 4 ends; the model sees the stop there
    closer.join(WAIT)
    assert not closer.is_alive() and seen == [1, 2, 3]
    assert model.steps_run["victim"] == 4 and model.active == 0 and model.decodes == 0
    model.step_gate = None
    assert isinstance(list(runner.stream(JOB))[-1], InferenceResult)  # the thread serves the next job
    runner.shutdown(timeout=WAIT)


def test_a_dying_thread_fails_the_running_and_every_waiting_job() -> None:
    model = FakeModel(hold=True)
    runner = ModelRunner(lambda: model)
    runner.start(timeout=WAIT)

    def die(job: InferenceJob) -> None:
        raise SystemExit("the thread dies")

    model.outcome = die
    running = in_thread(runner.stream(JOB))
    assert model.entered.wait(WAIT)
    waiting = [in_thread(runner.stream(JOB)) for _ in range(3)]
    model.release.release()
    for thread, events in [running, *waiting]:
        thread.join(WAIT)
        assert isinstance(events[-1], InferenceResult) and events[-1].reason == "engine_dead", events
    assert not runner.alive
    end = list(runner.stream(JOB))[-1]
    assert isinstance(end, InferenceResult) and end.reason == "engine_dead"


def test_a_failed_load_is_reported_by_start() -> None:
    def load() -> FakeModel:
        raise OSError("no such model")

    with pytest.raises(EngineDead, match="no such model"):
        ModelRunner(load).start(timeout=WAIT)


def test_run_job_is_the_installed_runner_behind_a_module_level_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "_RUNNER", None)
    assert [e.reason for e in run_job(JOB) if (isinstance(e, InferenceResult) and not e.ok)] == ["engine_dead"]
    runner = ModelRunner(FakeModel)
    runner.start(timeout=WAIT)
    install(runner)
    assert pickle.loads(pickle.dumps(run_job)) is run_job  # a picklable function of picklable arguments
    assert isinstance(list(run_job(JOB))[-1], InferenceResult)
    stop = threading.Event()
    stop.set()
    end = list(run_job(JOB, stop))[-1]
    assert isinstance(end, InferenceResult) and end.reason == "cancelled"
    runner.shutdown(timeout=WAIT)

"""The model side in a process of its own: plain data across, stop forwarded, healed when killed (the
launched app around it is in ``tests/server/test_model_process_app.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.engine.hosting.process import DEAD_MESSAGE, ProcessSide
from pipeline.protocol import EncodedPreview, InferenceJob, InferenceResult, StepEvent, StopSignal
from tests.fakes import FakeLoader
from tests.helpers import ROOT, process_exited, wait_for

JOB = InferenceJob("j", ("p",), ("",), (300, 301), 48, 32, 3, 7.5, preview_every=1, preview_images=(0, 1))
LONG = InferenceJob("long", ("p",), ("",), (1,), 32, 32, 500, 7.5)
WAIT = 60.0


def test_the_model_loads_and_runs_in_its_own_process_on_the_named_thread() -> None:
    side = ProcessSide(FakeLoader(), ready_timeout=WAIT)
    try:
        assert side.pid != os.getpid() and not process_exited(side.pid)
        assert side.profile.name == f"fake-model pid={side.pid} thread=gpu-worker"
        assert side.count_tokens("three words here") == {"CLIP": 3}
        events = list(side.stream(JOB, StopSignal()))
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert [(s.step, s.total) for s in steps] == [(1, 3), (2, 3), (3, 3)]
        assert all(isinstance(s.preview(1), EncodedPreview) and s.preview(1).image().size == (8, 8) for s in steps)
        result = events[-1]
        assert isinstance(result, InferenceResult) and result.steps_done == 3
        assert [im.size for im in result.images] == [(48, 32), (48, 32)]
        assert [im.getpixel((0, 0)) for im in result.images] == [(300 % 256, 1, 7), (301 % 256, 1, 7)]
        assert side.state == "ready" and side.alive
    finally:
        side.shutdown(timeout=WAIT)
    assert side.state == "closed" and not side.alive
    assert side._child.proc.returncode == 0  # it finished and exited by itself


@pytest.mark.parametrize("stop_kind", ["StopSignal", "Event"])
def test_stop_reaches_the_model_process_at_its_next_step(stop_kind: str) -> None:
    """A ``StopSignal`` is forwarded when set; a plain ``threading.Event`` is polled."""
    side = ProcessSide(FakeLoader(step_seconds=0.01), ready_timeout=WAIT)
    try:
        stop: Any = StopSignal() if stop_kind == "StopSignal" else threading.Event()
        events = []
        for event in side.stream(LONG, stop):
            events.append(event)
            if isinstance(event, StepEvent) and event.step == 2:
                stop.set()
        last = events[-1]
        assert isinstance(last, InferenceResult) and last.reason == "cancelled", last
        assert 2 <= last.steps_done < LONG.num_inference_steps
        if stop_kind == "StopSignal":  # the model process's own count when the stop reached it
            assert stop.steps_at_set is not None and 0 <= last.steps_done - stop.steps_at_set <= 1, (
                last.steps_done,
                stop.steps_at_set,
            )
        # the stop belonged to that job only: the next one runs to the end
        assert isinstance(list(side.stream(JOB, StopSignal()))[-1], InferenceResult)
    finally:
        side.shutdown(timeout=WAIT)


def test_a_killed_model_process_fails_its_job_at_once_and_the_next_job_waits_for_the_new_one() -> None:
    side = ProcessSide(FakeLoader(step_seconds=0.01), ready_timeout=WAIT, backoff=(1.0, 1.0))
    try:
        first = side.pid
        stream = side.stream(LONG, StopSignal())
        assert isinstance(next(stream), StepEvent)  # the job is running in the model process
        os.kill(first, signal.SIGKILL)  # what the OOM killer does
        rest = list(stream)
        assert len(rest) <= LONG.num_inference_steps and (isinstance(rest[-1], InferenceResult) and not rest[-1].ok)
        assert rest[-1].reason == "crashed" and "SIGKILL" in rest[-1].message, rest[-1]
        assert side.state == "recovering" and side.alive  # set before the job heard of the crash
        # A job that arrives meanwhile waits for the new process, then runs there.
        events = list(side.stream(JOB, StopSignal()))
        assert isinstance(events[-1], InferenceResult), events[-1]
        assert side.state == "ready" and side.restarts == 1 and side.pid != first
        assert side.profile.name == f"fake-model pid={side.pid} thread=gpu-worker"
        assert side.count_tokens("two words") == {"CLIP": 2}
    finally:
        side.shutdown(timeout=WAIT)


def test_after_repeated_failed_restarts_the_side_is_dead_and_jobs_get_an_error(tmp_path: Path) -> None:
    side = ProcessSide(FakeLoader(fail_marker=str(tmp_path / "loaded-once")), ready_timeout=WAIT, backoff=(0, 0.1, 0.1))
    try:
        os.kill(side.pid, signal.SIGKILL)
        wait_for(lambda: side.state != "ready", "the side noticed the death", timeout=WAIT)
        events = list(side.stream(JOB, StopSignal()))  # waits through the three failed restarts
        assert events == [InferenceResult.ended_by("engine_dead", DEAD_MESSAGE)]
        assert side.state == "dead" and not side.alive and side.restarts == 0
        assert side.count_tokens("a b") == {}
    finally:
        side.shutdown(timeout=WAIT)


def test_a_model_process_exits_when_its_server_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from pipeline.engine.hosting.process import ProcessSide
        from tests.fakes import FakeLoader
        side = ProcessSide(FakeLoader())
        print(side.pid, flush=True)
        time.sleep(600)
        """
    )
    server = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        assert not process_exited(child)
    finally:
        server.kill()
        server.wait()
    wait_for(lambda: process_exited(child), "the orphaned model process exited", timeout=WAIT)


def test_an_unpicklable_loader_is_refused_with_the_way_out() -> None:
    with pytest.raises(TypeError, match="--model-side thread"):
        ProcessSide(lambda: None)  # type: ignore[return-value]  # any lambda: it cannot be pickled

"""The serving side's one caller of the model boundary: the "model-stream" thread.

``ModelSide.stream(job, stop)`` blocks between events, so it is iterated here, off the event loop,
one job at a time: in-process it hands the job to the model thread; on ZeroGPU it is the
``@spaces.GPU`` call into the GPU process. Each job runs inside the ``contextvars`` context it was
submitted with (the head request's copy), so ``spaces`` sees that user's Gradio request.

A model side with a callback API of its own (``submit``: the in-process ``ModelRunner``, a model
process's ``ProcessSide``) is handed each job here and calls back as events happen, so several jobs
can be in flight (step-level joining, ``engine.loop.joining``) and no thread iterates a stream. A side
with only ``stream`` (ZeroGPU's ``@spaces.GPU`` call) runs one job at a time on this thread.

Every event is passed to the job's ``deliver`` callback (the adapter posts it to the event loop)
and the job's future resolves with its terminal event, after its last step has been delivered.
Exactly one terminal per job, whatever happens: if this thread dies, every job fails with an
``engine_dead`` error value instead of hanging.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Callable

from ..protocol import TERMINAL, ErrorEvent, InferenceJob, ModelEvent, ModelSide, StepEvent, StopSignal

log = logging.getLogger(__name__)

DEAD = ErrorEvent("engine_dead", "the model side has stopped; the server must be restarted")


@dataclass(frozen=True)
class _Task:
    job: InferenceJob
    stop: StopSignal
    context: contextvars.Context
    deliver: Callable[[ModelEvent], None]
    terminal: concurrent.futures.Future[ModelEvent]


_SHUTDOWN = object()


class ModelStreamer:
    """Iterates one job's event stream at a time on a named thread. ``submit`` from any thread."""

    def __init__(self, side: ModelSide, *, name: str = "model-stream") -> None:
        self.side = side
        self._tasks: queue.SimpleQueue[_Task | object] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _dead against a submit racing the thread's death
        self._dead = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._dead and self.side.alive

    @property
    def many_in_flight(self) -> bool:
        """Whether several jobs can be in flight on the side at once (``ModelSide.many_in_flight``)."""
        return bool(self.side.many_in_flight)

    def submit(
        self,
        job: InferenceJob,
        stop: StopSignal,
        deliver: Callable[[ModelEvent], None],
        context: contextvars.Context | None = None,
    ) -> concurrent.futures.Future[ModelEvent]:
        terminal: concurrent.futures.Future[ModelEvent] = concurrent.futures.Future()
        task = _Task(job, stop, context if context is not None else contextvars.copy_context(), deliver, terminal)
        with self._lock:
            if self._dead or not self._thread.is_alive():
                terminal.set_result(DEAD)
            else:
                self._tasks.put(task)
        return terminal

    def shutdown(self, timeout: float | None = None) -> None:
        """Finish the current job (its stop is the caller's to set), end the thread and the model side."""
        self._tasks.put(_SHUTDOWN)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.side.shutdown(timeout)

    # -- the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        task: _Task | object = None
        try:
            while (task := self._tasks.get()) is not _SHUTDOWN:
                assert isinstance(task, _Task)
                if self.many_in_flight:
                    task.context.run(self._hand_over, task)
                else:
                    task.terminal.set_result(task.context.run(self._drive, task))
        except BaseException as exc:  # dying: nobody may be left waiting, the running job included
            log.critical("the model-stream thread died: %r", exc, exc_info=True)
            if isinstance(task, _Task) and not task.terminal.done():
                task.terminal.set_result(DEAD)
            raise
        finally:
            with self._lock:
                self._dead = True
            self._fail_pending()

    def _hand_over(self, task: _Task) -> None:
        """Give the job to a side with callbacks; its events arrive on the side's own thread."""

        def emit(event: ModelEvent) -> None:
            if isinstance(event, TERMINAL):
                if not task.terminal.done():
                    task.terminal.set_result(event)
                return
            if isinstance(event, StepEvent):
                task.stop.note(event.step)
            task.deliver(event)

        try:
            self.side.submit(task.job, task.stop, emit)
        except Exception as exc:
            log.error("handing job %s to the model side failed", task.job.request_id, exc_info=True)
            emit(ErrorEvent("failed", f"{type(exc).__name__}: {exc}", 0, traceback.format_exc()))

    def _drive(self, task: _Task) -> ModelEvent:
        """Iterate the job's stream, delivering each step; return its terminal event."""
        try:
            with contextlib.closing(self.side.stream(task.job, task.stop)) as events:
                for event in events:
                    if isinstance(event, TERMINAL):
                        return event
                    if isinstance(event, StepEvent):
                        task.stop.note(event.step)
                    task.deliver(event)
        except Exception as exc:  # a broken model side answers this job, and the thread carries on
            log.error("the model stream of job %s failed", task.job.request_id, exc_info=True)
            return ErrorEvent("failed", f"{type(exc).__name__}: {exc}", task.stop.steps, traceback.format_exc())
        return ErrorEvent("failed", "the model stream ended without a result", task.stop.steps)

    def _fail_pending(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if isinstance(task, _Task) and not task.terminal.done():
                task.terminal.set_result(DEAD)

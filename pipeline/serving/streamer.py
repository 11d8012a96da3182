"""The serving side's one caller of the model boundary: the "model-stream" thread.

``ModelSide.stream(job, stop)`` blocks between events, so it is iterated here, off the event loop,
one job at a time: in-process it hands the job to the model thread; on ZeroGPU it is the
``@spaces.GPU`` call into the GPU process. Each job runs inside the ``contextvars`` context it was
submitted with (the head request's copy), so ``spaces`` sees that user's Gradio request.

A model side with a callback API of its own (``submit``: the in-process ``ModelRunner``, a model
process's ``ProcessSide``) is handed each job here and calls back as events happen, so several jobs
can be in flight (step-level joining, ``engine.loop.joining``) and no thread iterates a stream. A side
with only ``stream`` (ZeroGPU's ``@spaces.GPU`` call) runs one job at a time on this thread.

Every step is passed to the job's ``deliver`` callback (the adapter posts it to the event loop)
and the job's future resolves with its terminal event, after its last step has been delivered; a
job waits on this thread's queue as a ``protocol.Submission`` whose ``emit`` does both.
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
from typing import Callable

from ..protocol import InferenceJob, InferenceResult, ModelEvent, ModelSide, StopSignal, Submission

log = logging.getLogger(__name__)

DEAD = InferenceResult.ended_by("engine_dead", "the model side has stopped; the server must be restarted")


_SHUTDOWN = object()
# On the thread's queue: the job, the context it runs in, and the future of its terminal event.
_Queued = tuple[Submission, contextvars.Context, concurrent.futures.Future[ModelEvent]]


class ModelStreamer:
    """Iterates one job's event stream at a time on a named thread. ``submit`` from any thread."""

    def __init__(self, side: ModelSide, *, name: str = "model-stream") -> None:
        self.side = side
        self._tasks: queue.SimpleQueue[_Queued | object] = queue.SimpleQueue()
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

        def emit(event: ModelEvent) -> None:  # the side's thread, or this one: steps out, the end to the future
            if isinstance(event, InferenceResult):
                if not terminal.done():
                    terminal.set_result(event)
                return
            stop.note(event.step)
            deliver(event)

        queued = (Submission(job, stop, emit), context if context is not None else contextvars.copy_context(), terminal)
        with self._lock:
            if self._dead or not self._thread.is_alive():
                terminal.set_result(DEAD)
            else:
                self._tasks.put(queued)
        return terminal

    def shutdown(self, timeout: float | None = None) -> None:
        """Finish the current job (its stop is the caller's to set), end the thread and the model side."""
        self._tasks.put(_SHUTDOWN)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.side.shutdown(timeout)

    # -- the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        queued: _Queued | object = None
        try:
            while (queued := self._tasks.get()) is not _SHUTDOWN:
                assert isinstance(queued, tuple)
                task, context, _terminal = queued
                context.run(self._hand_over if self.many_in_flight else self._drive, task)
        except BaseException as exc:  # dying: nobody may be left waiting, the running job included
            log.critical("the model-stream thread died: %r", exc, exc_info=True)
            if isinstance(queued, tuple) and not queued[2].done():
                queued[2].set_result(DEAD)
            raise
        finally:
            with self._lock:
                self._dead = True
            self._fail_pending()

    def _hand_over(self, task: Submission) -> None:
        """Give the job to a side with callbacks; its events arrive on the side's own thread."""
        try:
            self.side.submit(task.job, task.stop, task.emit)
        except Exception as exc:
            log.error("handing job %s to the model side failed", task.job.request_id, exc_info=True)
            task.emit(InferenceResult.ended_by("failed", f"{type(exc).__name__}: {exc}", 0, traceback.format_exc()))

    def _drive(self, task: Submission) -> None:
        """Iterate the job's stream here, emitting each event; exactly one terminal, whatever happens."""
        steps = 0
        try:
            with contextlib.closing(self.side.stream(task.job, task.stop)) as events:
                for event in events:
                    task.emit(event)
                    if isinstance(event, InferenceResult):
                        return
                    steps = event.step
        except Exception as exc:  # a broken model side answers this job, and the thread carries on
            log.error("the model stream of job %s failed", task.job.request_id, exc_info=True)
            task.emit(InferenceResult.ended_by("failed", f"{type(exc).__name__}: {exc}", steps, traceback.format_exc()))
            return
        task.emit(InferenceResult.ended_by("failed", "the model stream ended without a result", steps))

    def _fail_pending(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if isinstance(task, tuple) and not task[2].done():
                task[2].set_result(DEAD)

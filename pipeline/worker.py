"""The model thread ("gpu-worker"): it loads the model, owns it and the device, and runs jobs.

Nothing else touches the model. Jobs arrive on a queue and each one gets exactly one terminal
reply through its ``concurrent.futures.Future``: a result, ``Cancelled``, an error, or, if the
thread dies, ``EngineDead`` (and so does every job still waiting).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from .errors import EngineDead
from .protocol import InferenceJob, InferenceResult, Model, ModelProfile, StepCallback

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Task:
    job: InferenceJob
    stop: threading.Event
    on_step: StepCallback
    future: concurrent.futures.Future[InferenceResult]


_SHUTDOWN = object()


class GpuWorker:
    """Owns one ``Model`` on one named thread. ``submit`` may be called from any thread."""

    def __init__(self, load: Callable[[], Model], *, name: str = "gpu-worker") -> None:
        self._load = load
        self._tasks: queue.Queue[_Task | object] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()
        self._model: Model | None = None
        self._dead: BaseException | None = None
        self._lock = threading.Lock()  # guards _dead against submit racing the thread's death
        self.busy = False  # written only by the model thread; read anywhere

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> ModelProfile:
        """Start the thread and wait until the model is loaded; raise ``EngineDead`` if it failed."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise EngineDead(f"the model did not load within {timeout} s")
        if self._model is None:
            raise EngineDead(f"the model failed to load: {self._dead!r}")
        return self._model.profile

    def shutdown(self, timeout: float | None = None) -> None:
        """Finish the current job (its stop event is the caller's to set), then end the thread."""
        self._tasks.put(_SHUTDOWN)
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._dead is None

    @property
    def model(self) -> Model:
        if self._model is None:
            raise EngineDead("the model is not loaded")
        return self._model

    # -- jobs --------------------------------------------------------------------------------
    def submit(
        self, job: InferenceJob, stop: threading.Event, on_step: StepCallback
    ) -> concurrent.futures.Future[InferenceResult]:
        future: concurrent.futures.Future[InferenceResult] = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None or not self._thread.is_alive():
                future.set_exception(EngineDead("the model thread has stopped; the server must be restarted"))
                return future
            self._tasks.put(_Task(job, stop, on_step, future))
        return future

    # -- the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._model = self._load()
        except BaseException as exc:  # noqa: BLE001 - reported through start()
            log.exception("model load failed")
            self._dead = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                task = self._tasks.get()
                if task is _SHUTDOWN:
                    break
                assert isinstance(task, _Task)
                self._run(task)
        except BaseException as exc:  # the thread is dying: nobody may be left waiting
            log.critical("model thread died: %r", exc, exc_info=True)
            with self._lock:
                self._dead = exc
        finally:
            self._fail_pending()

    def _run(self, task: _Task) -> None:
        if not task.future.set_running_or_notify_cancel():
            return
        self.busy = True
        try:
            result = self.model.generate(task.job, task.stop, task.on_step)
        except Exception as exc:  # one job's fault; the thread carries on
            task.future.set_exception(exc)
        except BaseException:
            task.future.set_exception(EngineDead("the model thread has stopped; the server must be restarted"))
            raise
        else:
            task.future.set_result(result)
        finally:
            self.busy = False

    def _fail_pending(self) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = EngineDead("shut down")
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if isinstance(task, _Task) and task.future.set_running_or_notify_cancel():
                task.future.set_exception(EngineDead("the model thread has stopped"))

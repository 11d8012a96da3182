"""The model thread ("gpu-worker") and the boundary generator ``run_job``.

``ModelRunner`` loads one ``Model`` on one named thread and runs every job there: that thread owns
the model and the device, in whichever process hosts it. ``ModelRunner.stream(job, stop)`` hands a
job to the thread and yields its ``ModelEvent`` values as they happen (the model's step callback
becomes a stream of plain data); closing the stream early stops the job at its next step and
returns only once the thread has left the job.

``ModelRunner.submit(job, stop, emit)`` is the same without a stream: ``emit`` is called on the
model thread with each event (several jobs may be in flight: a job marked ``joinable`` enters a
running denoising loop of compatible jobs at its next step boundary, ``engine.loop.joining``).

``run_job(job)`` is the same stream as a module-level generator of picklable arguments, for hosts
that pickle the call: ZeroGPU's ``@spaces.GPU`` forks a process, sends it ``job`` and reads back
each yield. After a fork the model (inherited) gets a fresh thread of its own in the child.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections import deque
from typing import Callable, Generator, Mapping

from ...errors import Cancelled, EngineDead
from ...protocol import (
    InferenceJob,
    InferenceResult,
    Model,
    ModelEvent,
    ModelProfile,
    StepEvent,
    StopFlag,
    Submission,
    encoded,
)
from ..device_faults import fault_event
from ..loop.joining import LoopDriver, enters_after_members, in_a_loop

log = logging.getLogger(__name__)

DEAD_MESSAGE = "the model thread has stopped; the server must be restarted"


NEVER: StopFlag = threading.Event()  # a stop nobody sets


class _JobStop:
    """The job's stop as the model sees it: the caller's flag, or the stream being closed."""

    def __init__(self, caller: StopFlag) -> None:
        self.caller = caller
        self.closed = threading.Event()

    def is_set(self) -> bool:
        return self.closed.is_set() or self.caller.is_set()

    def note(self, step: int) -> None:
        """In-process, the caller's stop counts steps as they end (``protocol.StopSignal``)."""
        note = getattr(self.caller, "note", None)
        if note is not None:
            note(step)


_SHUTDOWN = object()


class ModelRunner:
    """Owns one ``Model`` on one named thread. ``stream`` may be called from any thread."""

    def __init__(
        self,
        load: Callable[[], Model],
        *,
        name: str = "gpu-worker",
        on_poisoned: Callable[[str], object] | None = None,
    ) -> None:
        self._load = load
        self._name = name
        self._model: Model | None = None
        self._dead: BaseException | None = None
        # A job ended with ``device_lost`` (``engine.device_faults``): every later kernel would fail.
        # In a model process ``on_poisoned`` ends the process (the server starts a new one); on a
        # thread the runner is dead, and ``/health`` says so, so that an orchestrator restarts the app.
        self._on_poisoned = on_poisoned
        self._poisoned: str | None = None
        self.memory = DeviceMemory()  # the model's device memory probe is set once it is loaded
        self._ready = threading.Event()
        self._start_thread(load_first=True)

    def _start_thread(self, *, load_first: bool) -> None:
        self._pid = os.getpid()
        self._tasks: queue.SimpleQueue[Submission | object] = queue.SimpleQueue()
        self._later: deque[Submission | object] = deque()  # taken off the queue during a loop, not for it
        self._lock = threading.Lock()  # guards _dead against a submit racing the thread's death
        self._thread = threading.Thread(target=self._main, args=(load_first,), name=self._name, daemon=True)

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
        """Finish the current job (its stop is the caller's to set), then end the thread."""
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

    @property
    def profile(self) -> ModelProfile:
        return self.model.profile

    def count_tokens(self, text: str, model: str = "") -> Mapping[str, int]:
        """Tokens per encoder of the model ``model`` names (several models: ``engine.model.shelf``; "": the default)."""
        if model and hasattr(self.model, "models"):
            return self.model.count_tokens(text, model)  # type: ignore[call-arg]
        return self.model.count_tokens(text)

    # -- jobs --------------------------------------------------------------------------------
    many_in_flight = True  # ``submit`` queues the job for the model thread and returns

    def submit(self, job: InferenceJob, stop: StopFlag, emit: Callable[[ModelEvent], None]) -> None:
        """Queue ``job``; ``emit`` gets its events on the model thread, the last one terminal. Never blocks."""
        self._after_fork()
        task = Submission(job, _JobStop(stop), self._watched(emit, job))
        with self._lock:
            if self._dead is None and self._thread.is_alive():
                self._tasks.put(task)
                return
        emit(InferenceResult.ended_by("engine_dead", DEAD_MESSAGE))

    def stream(self, job: InferenceJob, stop: StopFlag = NEVER) -> Generator[ModelEvent, None, None]:
        """Run ``job`` on the model thread; yield its steps, then one result or error value."""
        self._after_fork()
        events: queue.SimpleQueue[ModelEvent] = queue.SimpleQueue()
        mine = _JobStop(stop)
        task = Submission(job, mine, self._watched(events.put, job))
        with self._lock:
            if self._dead is not None or not self._thread.is_alive():
                yield InferenceResult.ended_by("engine_dead", DEAD_MESSAGE)
                return
            self._tasks.put(task)
        ended = False
        try:
            while not ended:
                event = events.get()
                ended = isinstance(event, InferenceResult)
                yield event
        finally:
            if not ended:  # closed early: stop at the next step, and wait until the thread has left
                mine.closed.set()
                while not isinstance(events.get(), InferenceResult):
                    pass

    def _watched(self, emit: Callable[[ModelEvent], None], job: InferenceJob) -> Callable[[ModelEvent], None]:
        """``emit``, noting a ``device_lost`` ending (the thread ends the model side after that job) and
        stamping a result with the device's memory (``memory.DeviceMemory``: the scheduler learns from it)."""

        def watched(event: ModelEvent) -> None:
            if isinstance(event, InferenceResult) and event.reason == "device_lost":
                self._poisoned = self._poisoned or event.message
            elif isinstance(event, InferenceResult):
                event = self.memory.stamp(event)
            if isinstance(event, InferenceResult) and (stamp := getattr(self._model, "stamp", None)) is not None:
                event = stamp(event, job)  # several models: which one, and where each is (``engine.model.shelf``)
            emit(event)

        return watched

    def _after_fork(self) -> None:
        """In a forked child (ZeroGPU) the thread is gone but the model is here: give it a new thread."""
        if self._pid != os.getpid() and self._model is not None:
            log.info("in a new process (pid %d): starting a model thread for the inherited model", os.getpid())
            self._start_thread(load_first=False)
            self._dead = None
            self._thread.start()

    # -- the thread --------------------------------------------------------------------------
    def _main(self, load_first: bool) -> None:
        if load_first:
            try:
                self._model = self._load()
            except BaseException as exc:
                log.exception("model load failed")
                self._dead = exc
                self._ready.set()
                return
            self._ready.set()
        self.memory.probe = getattr(self._model, "device_memory", None)
        try:
            while (task := self._next()) is not _SHUTDOWN:
                assert isinstance(task, Submission)
                if in_a_loop(self.model, task.job):
                    self._run_loop(task)
                else:
                    self.memory.idle()
                    self._run(task)
                if self._poisoned is not None:
                    self._end_poisoned(self._poisoned)
                    return
        except BaseException as exc:  # the thread is dying: nobody may be left waiting
            log.critical("model thread died: %r", exc, exc_info=True)
            with self._lock:
                self._dead = exc
        finally:
            self._fail_pending()

    def _end_poisoned(self, reason: str) -> None:
        log.critical("the device is poisoned (%s): every later kernel would fail; ending this model side", reason)
        with self._lock:
            self._dead = RuntimeError(f"the device failed: {reason}")
        if self._on_poisoned is not None:
            self._on_poisoned(reason)

    def _next(self) -> Submission | object:
        return self._later.popleft() if self._later else self._tasks.get()

    def _run_loop(self, first: Submission) -> None:
        """A step-level loop (``engine.loop.joining``): ``first``, and every job the serving side's
        scheduler tagged for the same loop, each entering at the next step boundary once the members
        it names in ``enters_after`` have left. The model thread decides nothing about who shares
        the loop: what arrives for another loop (or as one call) waits until this one is over."""
        loop_id = first.job.loop_id
        ours = [t for t in self._later if isinstance(t, Submission) and t.job.joinable and t.job.loop_id == loop_id]
        joiners: deque[Submission] = deque(ours)  # tagged for this loop, in arrival order, not yet in it
        self._later = deque(t for t in self._later if t not in ours)

        def pull() -> Submission | None:  # at a step boundary: the next joiner whose place is free, or None
            while True:
                if joiners:
                    in_loop = [m.task.job.request_id for m in driver.members]
                    return None if enters_after_members(joiners[0].job, in_loop) else joiners.popleft()
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    return None
                if isinstance(task, Submission) and task.job.joinable and task.job.loop_id == loop_id:
                    joiners.append(task)
                else:
                    self._later.append(task)

        self.memory.idle()
        try:
            loop = self.model.open_loop(first.job)  # type: ignore[attr-defined]
        except Exception as exc:
            first.emit(fault_event(exc))
            return
        driver = LoopDriver(loop, pull)
        try:
            driver.run(first)
        finally:
            if (close := getattr(self.model, "close_loop", None)) is not None:
                close()  # several models: the loop's model may move again (``engine.model.shelf``)
        self._later.extendleft(reversed(joiners))  # the loop emptied first: they open the next one

    def _run(self, task: Submission) -> None:
        """One job; exactly one terminal event, whatever happens."""
        job, emit = task.job, task.emit

        note = getattr(task.stop, "note", None)  # the job's stop counts its steps (``_JobStop.note``)

        def on_step(step: int, total: int, previews: object) -> None:
            if note is not None:
                note(step)
            emit(StepEvent(step, total, encoded(previews)))  # encoded here, on the model thread

        try:
            result = self.model.generate(job, task.stop, on_step)
        except Cancelled as exc:
            emit(InferenceResult.ended_by("cancelled", str(exc), exc.steps_done))
        except Exception as exc:  # one job's fault (the thread carries on), memory, or a poisoned device
            emit(fault_event(exc))
        except BaseException:
            emit(InferenceResult.ended_by("engine_dead", DEAD_MESSAGE))
            raise
        else:
            emit(
                result
                if isinstance(result, InferenceResult)
                else InferenceResult.ended_by("failed", f"the model returned {type(result).__name__}, not a result")
            )

    def _fail_pending(self) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = RuntimeError("shut down")
        while self._later:
            task = self._later.popleft()
            if isinstance(task, Submission):
                task.emit(InferenceResult.ended_by("engine_dead", DEAD_MESSAGE))
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if isinstance(task, Submission):
                task.emit(InferenceResult.ended_by("engine_dead", DEAD_MESSAGE))


# -- the boundary as a module-level generator (picklable arguments only) ----------------------------
_RUNNER: ModelRunner | None = None


def install(runner: ModelRunner) -> None:
    """Make ``runner`` this process's model side for ``run_job`` (a forked child inherits it)."""
    global _RUNNER
    _RUNNER = runner


def run_job(job: InferenceJob, stop: StopFlag | None = None) -> Generator[ModelEvent, None, None]:
    """The boundary generator: one ``InferenceJob`` in, ``ModelEvent`` values out.

    ``stop``, where the host can pass one (a ``multiprocessing.Event`` inherited by a model
    process), is read at every step. Stop also reaches the job as the closing of this generator at
    a yield (what ``spaces.GPU`` does in its child when its caller leaves): the job stops at its
    next step, and the close returns once the model thread has left it.
    """
    if _RUNNER is None:
        yield InferenceResult.ended_by("engine_dead", "no model is loaded in this process")
        return
    yield from _RUNNER.stream(job, stop if stop is not None else NEVER)


# -- the device's memory, reported with every result -----------------------------------------------
# The device's memory as the model side reads it, reported with every result.
#
# A joiner that would not fit beside a running step-level loop must wait for the next loop instead of
# entering and failing everyone in it with an out-of-memory error. The serving side's scheduler
# decides that (``serving.scheduler.MemoryRoom``) from what the model side measures: the device's
# total memory, the footprint with no job running (the weights), read before each loop or call opens,
# and each job's peak. This module only reads and reports; on a device that reports no memory (the
# CPU) it reports nothing. Owned by the model thread.
class DeviceMemory:
    """The device's total and idle bytes, stamped on each result (see the module doc)."""

    def __init__(self, probe: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.probe = probe  # () -> (the device's total bytes, bytes allocated now); None: not a GPU
        self.total: int | None = None
        self.base: int | None = None  # bytes allocated with no job running (the weights)

    def idle(self) -> None:
        """Note the footprint with no job running (called before a loop or a call opens)."""
        reading = self.probe() if self.probe is not None else None
        if reading is not None:
            self.total, self.base = reading

    def stamp(self, result: InferenceResult) -> InferenceResult:
        if self.total is None or self.base is None:
            return result
        return dataclasses.replace(result, device_total_bytes=self.total, idle_bytes=self.base)

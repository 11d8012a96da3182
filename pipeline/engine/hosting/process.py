"""The model side in a process of its own (``--model-side process``, the default), healed when it dies.

Why a process: the server's event loop, its PNG encoders and the model's Python-side work all want
the GIL; in its own process the model has a GIL of its own, and the server never imports torch.
The server's gate and its ``model-stream`` thread call ``ProcessSide.submit``/``stream`` as they
call the in-process ``ModelRunner``; only the pickled message dataclasses of ``engine.hosting.wire`` cross,
on one socket pair (``RunJob``, ``StopJob``, ``CountTokens``, ``Shutdown`` to the model process;
``Ready`` or ``LoadFailed``, then ``JobEvent`` and ``TokenCounts`` back).

Inside the model process one named thread owns the model and the device: the same ``ModelRunner``
(``gpu-worker``) as under ``--model-side thread``. Several jobs may be in flight (joinable ones share
a step-level loop there, ``engine.loop.joining``); each job's stop is forwarded the moment it is set.

Healing. When the model process dies (the OOM killer's SIGKILL, a segfault, or a device error that
poisons its CUDA context: it answers that job and exits, ``engine.device_faults``), the server's
``model-pipe`` reader sees the socket close:

- the running job gets a ``crashed`` error at once (never a hang);
- jobs still waiting stay in line: ``stream`` waits for the next process before sending its job;
- ``state`` is ``recovering`` (``/health`` shows it) while a ``model-restart`` thread starts a new
  process, with bounded retries and backoff; after ``len(backoff)`` failures in a row it is
  ``dead``, and every job gets an ``engine_dead`` error.
A model process exits by itself when the server goes away (its socket closes).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generator, Mapping

from ...errors import EngineDead
from ...protocol import InferenceJob, InferenceResult, Model, ModelEvent, ModelProfile, StopFlag
from . import wire

if TYPE_CHECKING:
    from ...config import Settings

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 600.0  # a big model's first load (from disk, onto the device) can take minutes
RESTART_BACKOFF_SECONDS = (0.0, 1.0, 2.0, 4.0, 8.0)  # before each restart attempt; its length bounds the retries
STOP_POLL_SECONDS = 0.02  # for a stop without ``on_set`` (a plain threading.Event)
DEAD_MESSAGE = "the model process could not be restarted; the server must be restarted"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds ``pipeline``


@dataclass(frozen=True)
class SettingsLoader:
    """A picklable loader: ``load_model(settings)``, imported only in the model process (torch lives there)."""

    settings: Settings

    def __call__(self) -> Model:
        from ..model.loading import load_model

        return load_model(self.settings)


def exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "it closed its connection"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return "its device failed and poisoned it" if returncode == wire.EXIT_POISONED else f"exit code {returncode}"


def _poll_stop(stop: StopFlag, ended: threading.Event, forward: Callable[[], None]) -> None:
    """For a stop without ``on_set``: forward it when it is set, until the job ends."""
    while not ended.wait(STOP_POLL_SECONDS):
        if stop.is_set():
            forward()
            return


class _Child:
    """One model process, its connection and the ``model-pipe`` thread that reads it."""

    def __init__(self, load_blob: bytes, generation: int, on_exit: Callable[[_Child], None]) -> None:
        self.generation = generation
        self._on_exit = on_exit
        self.lock = threading.Lock()  # guards sending, ``pending``, ``counts`` and ``exited``
        self.pending: dict[int, Callable[[ModelEvent], None]] = {}  # job serial -> where its events go
        self.counts: dict[int, queue.SimpleQueue[Mapping[str, int] | None]] = {}
        self.exited = False
        self.profile: ModelProfile | None = None
        self._ready = threading.Event()
        self._failure = ""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.engine.hosting.child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send_bytes(load_blob)
        self.reader = threading.Thread(target=self._read, name=f"model-pipe-{generation}", daemon=True)
        self.reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> ModelProfile:
        if not self._ready.wait(timeout):
            self.kill()
            raise EngineDead(f"the model process did not load the model within {timeout:.0f} s")
        if self.profile is None:
            raise EngineDead(f"the model process failed to load the model: {self._failure}")
        return self.profile

    def send(self, message: wire.ToModel) -> bool:
        """Send one message; False if the process has gone (its reader is telling everyone).

        Pickled before the lock (``multiprocessing``'s own format, as its ``send`` writes it, read by
        ``recv``): a stop sent from the event loop waits at most for another message's bytes to be
        written, never for a large job's pictures to be pickled."""
        blob = ForkingPickler.dumps(message)
        with self.lock:
            if self.exited:
                return False
            try:
                self.conn.send_bytes(blob)
            except OSError:
                return False
        return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def _read(self) -> None:
        try:
            while True:
                message: wire.ToServer = self.conn.recv()
                if isinstance(message, wire.JobEvent):
                    with self.lock:
                        sink = self.pending.get(message.serial)
                    if sink is not None:
                        sink(message.event)
                elif isinstance(message, wire.TokenCounts):
                    with self.lock:
                        answer = self.counts.pop(message.key, None)
                    if answer is not None:
                        answer.put(message.counts)
                elif isinstance(message, wire.Ready):
                    self.profile = message.profile
                    self._ready.set()
                elif isinstance(message, wire.LoadFailed):
                    self._failure = message.message
                    self._ready.set()
        except (EOFError, OSError):
            pass
        except BaseException:
            log.exception("the model-pipe reader failed")
        self._exit()

    def _exit(self) -> None:
        """The process has gone: answer everyone waiting on it, then tell the side."""
        with self.lock:
            self.exited = True
            pending, self.pending = self.pending, {}
            counts, self.counts = self.counts, {}
        try:
            returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            returncode = self.proc.wait()
        reason = exit_reason(returncode)
        self._failure = self._failure or reason
        self._ready.set()
        self.conn.close()
        self._on_exit(self)  # first, so whoever hears of the crash finds the side recovering
        for sink in pending.values():
            sink(
                InferenceResult.ended_by(
                    "crashed", f"the model process stopped during the job ({reason}); it is restarting"
                )
            )
        for answer in counts.values():
            answer.put(None)


class ProcessSide:
    """``ModelSide`` whose model runs in a child process, restarted when it dies.

    ``load`` must be picklable (``SettingsLoader``, or a module-level class or function): it is
    sent to each model process, which calls it on its ``gpu-worker`` thread.
    """

    def __init__(
        self,
        load: Callable[[], Model],
        *,
        ready_timeout: float = READY_TIMEOUT_SECONDS,
        backoff: tuple[float, ...] = RESTART_BACKOFF_SECONDS,
    ) -> None:
        try:
            self._load_blob = pickle.dumps(load)
        except Exception as exc:
            raise TypeError(
                f"--model-side process needs a picklable model loader, got {load!r} ({exc}); "
                "use a module-level function or class, or --model-side thread"
            ) from exc
        self.ready_timeout = ready_timeout
        self.backoff = backoff
        self.restarts = 0  # successful restarts, for /health and /metrics
        self._cond = threading.Condition()  # guards the state below
        self._state = "starting"  # starting | ready | draining | recovering | dead | closed
        self._generations = itertools.count()
        self._serials = itertools.count()
        self._child = _Child(self._load_blob, next(self._generations), self._child_exited)
        self._profile = self._child.wait_ready(ready_timeout)
        with self._cond:
            if self._state == "starting":
                self._state = "ready"
        log.info("the model runs in its own process (pid %d): %s", self._child.pid, self._profile.name)

    # -- ModelSide ---------------------------------------------------------------------------
    @property
    def profile(self) -> ModelProfile:
        return self._profile

    @property
    def alive(self) -> bool:
        return self._state not in ("dead", "closed")

    @property
    def state(self) -> str:
        """ready, recovering (a new model process is starting, or the poisoned one is ending), dead or closed."""
        return "recovering" if self._state == "draining" else self._state

    @property
    def pid(self) -> int:
        return self._child.pid

    def count_tokens(self, text: str, model: str = "") -> Mapping[str, int]:
        """The model process counts; while it restarts, no counts (the request only loses its truncation note)."""
        child = self._child
        if self._state != "ready":
            return {}
        answer: queue.SimpleQueue[Mapping[str, int] | None] = queue.SimpleQueue()
        key = next(self._serials)
        with child.lock:
            if child.exited:
                return {}
            child.counts[key] = answer
        if not child.send(wire.CountTokens(key, text, model)):
            return {}
        return answer.get() or {}

    many_in_flight = True  # ``submit`` sends the job to the model process and returns

    def submit(self, job: InferenceJob, stop: StopFlag, emit: Callable[[ModelEvent], None]) -> Callable[[], None]:
        """Send ``job`` to the model process; ``emit`` gets its events on the ``model-pipe`` thread, the
        last one terminal (exactly one, whatever happens). Several jobs may be in flight (a joinable
        one enters the running loop there, ``engine.loop.joining``).

        Blocks only while the model process restarts. The stop is forwarded the moment it is set
        (through ``stop.on_set``; a plain flag is polled). Returns a function that forwards it now.
        """
        forwarded = threading.Event()
        ended = threading.Event()
        while True:
            child = self._wait_ready(stop)
            if child is None:
                emit(
                    InferenceResult.ended_by("cancelled", "stopped while the model process restarted")
                    if stop.is_set()
                    else InferenceResult.ended_by("engine_dead", DEAD_MESSAGE)
                )
                return lambda: None
            serial = next(self._serials)

            def sink(event: ModelEvent, child: _Child = child, serial: int = serial) -> None:  # model-pipe thread
                if isinstance(event, InferenceResult):
                    forwarded.set()  # a late stop must not be sent for a job that has ended
                    ended.set()
                    if event.reason == "device_lost":
                        self._draining(child)
                    with child.lock:
                        child.pending.pop(serial, None)
                    if event.steps_at_stop is not None and hasattr(stop, "steps_at_set"):
                        stop.steps_at_set = event.steps_at_stop  # the model's own count when the stop reached it
                emit(event)

            with child.lock:
                if registered := not child.exited:
                    child.pending[serial] = sink
            if registered and child.send(wire.RunJob(serial, job)):
                break
            with child.lock:  # it died before the job reached it: the job waits for the next process
                child.pending.pop(serial, None)

        def forward_stop() -> None:  # on whichever thread sets the stop (the event loop, usually)
            if not forwarded.is_set():
                forwarded.set()
                child.send(wire.StopJob(serial))

        on_set = getattr(stop, "on_set", None)
        if on_set is not None:
            on_set(forward_stop)
        else:
            threading.Thread(target=_poll_stop, args=(stop, ended, forward_stop), name="stop-poll", daemon=True).start()
        if stop.is_set():
            forward_stop()
        return forward_stop

    def stream(self, job: InferenceJob, stop: StopFlag) -> Generator[ModelEvent, None, None]:
        """``submit`` as a stream of events (one terminal, whatever happens)."""
        events: queue.SimpleQueue[ModelEvent] = queue.SimpleQueue()
        forward_stop = self.submit(job, stop, events.put)
        ended = False
        try:
            while not ended:
                event = events.get()
                ended = isinstance(event, InferenceResult)
                yield event
        finally:
            if not ended:  # closed early: stop the job and wait until the model process has left it
                forward_stop()
                while not isinstance(events.get(), InferenceResult):
                    pass

    def shutdown(self, timeout: float | None = None) -> None:
        """Let the current job finish (its stop is the caller's to set), then end the model process."""
        with self._cond:
            self._state = "closed"
            self._cond.notify_all()
        child = self._child
        child.send(wire.Shutdown())
        try:
            child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the model process did not exit within %s s: killing it", timeout)
            child.kill()
            child.proc.wait()

    # -- healing -----------------------------------------------------------------------------
    def _wait_ready(self, stop: StopFlag) -> _Child | None:
        with self._cond:
            while self._state in ("starting", "recovering", "draining") and not stop.is_set():
                self._cond.wait(STOP_POLL_SECONDS * 5)
            return self._child if self._state == "ready" else None

    def _draining(self, child: _Child) -> None:  # the child's model-pipe thread
        """Its device is poisoned: it answers its jobs and exits, so new jobs wait for the next one."""
        with self._cond:
            if child is self._child and self._state == "ready":
                self._state = "draining"

    def _child_exited(self, child: _Child) -> None:  # the child's model-pipe thread
        with self._cond:
            # Only a serving process's death starts the healing: a first load that fails makes
            # __init__ raise, and a restart that fails is the restart loop's to retry.
            if child is not self._child or self._state not in ("ready", "draining"):
                return
            self._state = "recovering"
        reason = exit_reason(child.proc.returncode)
        log.error("the model process (pid %d) stopped (%s): restarting it", child.pid, reason)
        threading.Thread(target=self._restart, name="model-restart", daemon=True).start()

    def _restart(self) -> None:
        for attempt, pause in enumerate(self.backoff, 1):
            time.sleep(pause)
            with self._cond:
                if self._state != "recovering":
                    return
            try:
                child = _Child(self._load_blob, next(self._generations), self._child_exited)
                with self._cond:
                    self._child = child  # before it is ready, so its own death is noticed
                profile = child.wait_ready(self.ready_timeout)
            except Exception as exc:
                log.error("restart %d of %d failed: %s", attempt, len(self.backoff), exc)
                continue
            with self._cond:
                if child.exited or self._state != "recovering":
                    continue
                self._profile = profile
                self._state = "ready"
                self.restarts += 1
                self._cond.notify_all()
            log.warning("the model process is back (pid %d, restart %d)", child.pid, attempt)
            return
        with self._cond:
            if self._state == "recovering":
                self._state = "dead"
            self._cond.notify_all()
        log.critical("the model process could not be restarted after %d attempts", len(self.backoff))

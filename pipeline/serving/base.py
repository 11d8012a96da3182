"""The ``Adapter`` protocol, and what every adapter shares: accounting, health, close, liveness.

An adapter is what the web layer drives: ``run(raw)`` streams one request's ``protocol.Output``s
(waiting, its steps, then done), or raises a ``ServingError``. ``LocalAdapter`` runs the model in this
process; ``ray.adapter.RayAdapter`` runs it on Ray Serve replicas. ``AdapterBase`` holds the parts they
share, so each adapter is only its own request path (``_request``).

Owners: the event loop owns ``in_flight``, ``consecutive_failures``, ``closing`` and the liveness
watch; another thread (a signal handler's, the app's shutdown) reaches them through ``on_loop``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable, Iterator, Mapping, Protocol

from ..errors import Cancelled, InvalidRequest, QueueFull, RetryLater, ShuttingDown
from ..protocol import ModelProfile, Output
from ..request import Limits
from .decoding import Decoder
from .metrics import Metrics
from .quota import Held, ImageQuota

log = logging.getLogger(__name__)

DEGRADED_AFTER = 3  # consecutive failed requests
# How a request was stopped (``Adapter.abort``'s reasons, counted in /metrics' ``stops_total``): its
# caller closed its stream (Stop, Escape, a cancelled job); its caller vanished (a closed tab, a
# dropped gradio_client: Gradio marks the event dead and tells no one, so the liveness watch looks);
# AUTOMATIC1111's interrupt; an HTTP API client disconnected; its time limit; shutdown.
STOP_REASONS = ("closed", "gone", "interrupt", "disconnect", "time_limit", "shutdown")
SHUTDOWN_MESSAGE = "The server is shutting down; please retry in a moment."
ALIVE_POLL_SECONDS = 0.02  # how often the one liveness watch checks every caller


class Adapter(Protocol):
    """What the web layer needs from a backend."""

    limits: Limits
    metrics: Metrics
    closing: bool
    in_flight: int
    max_in_flight: int | None
    quota: ImageQuota | None
    decoder: Decoder

    @property
    def profile(self) -> ModelProfile: ...

    def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
        user: str | None = None,
        account: str | None = None,
    ) -> AsyncGenerator[Output, None]: ...

    def health(self) -> dict[str, Any]: ...

    def abort(self, request_id: str, reason: str = "closed") -> bool: ...

    def begin_shutdown(self) -> None: ...

    def on_close(self, callback: Callable[[], None]) -> None: ...

    def shutdown_model(self, timeout: float | None = None) -> None: ...

    def close(self) -> None: ...


class LivenessWatch:
    """One task on the loop checks every watched caller; a caller found gone gets its ``on_gone`` once.

    Gradio marks an event dead the moment its client goes away, but a handler hears of it only at
    its next yield (a whole denoising step later, or never while it waits in line). One watch for
    all in-flight requests replaces a poll task per request; it sleeps when nobody is watched.
    """

    def __init__(self, every: float = ALIVE_POLL_SECONDS) -> None:
        self.every = every
        self._watched: dict[int, tuple[Callable[[], bool], Callable[[], object]]] = {}
        self._keys = itertools.count()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, alive: Callable[[], bool] | None, on_gone: Callable[[], object]) -> Iterator[None]:
        if alive is None:
            yield
            return
        key = next(self._keys)
        self._watched[key] = (alive, on_gone)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="liveness-watch")
        try:
            yield
        finally:
            self._watched.pop(key, None)

    async def _watch(self) -> None:
        while self._watched:
            for key, (alive, on_gone) in list(self._watched.items()):
                if not alive() and self._watched.pop(key, None) is not None:
                    log.info("a caller went away: stopping its request")
                    on_gone()
            await asyncio.sleep(self.every)


@dataclass
class Abortable:
    """A request in flight as ``abort`` reaches it: how to stop it, and the first reason it was stopped for."""

    stop: Callable[[], None]
    reason: str | None = None


@dataclass
class Outcome:
    """How one request ended, for the books (``AdapterBase.accounted``)."""

    name: str = "failed"  # completed, rejected, cancelled or failed
    delivered: bool = False  # its images were handed over


class _Uncounted:
    """A request's images when no quota counts them."""

    def keep(self) -> None:
        pass

    def ran(self) -> None:
        pass


_UNCOUNTED = _Uncounted()


class AdapterBase:
    """Accounting, health, close hooks, shutdown and the liveness watch, for every adapter."""

    profile: ModelProfile
    limits: Limits

    def __init__(self, metrics: Metrics, *, pool_threads: int | None = None) -> None:
        self.metrics = metrics
        self.closing = False
        self.consecutive_failures = 0
        self.in_flight = 0
        self.max_in_flight: int | None = None  # requests held at once (``Settings.admitted``); None: no bound
        self.liveness = LivenessWatch()
        self.quota: ImageQuota | None = None  # --quota-images-per-hour (``quota``); None: off
        self.decoder = Decoder()  # client pictures, on threads of their own (``decoding``)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_close: list[Callable[[], None]] = []
        self._abortable: dict[str, Abortable] = {}  # request id -> how to stop it, while it runs (event loop)
        # Short CPU work (validation, token counting, PNG encoding) off the event loop, on threads
        # the adapter names and owns: one per core, as Pillow's PNG encoder releases the GIL (two
        # threads encode 1.92x as fast as one on 2 cores; docs/performance-notes.md).
        threads = pool_threads or max(2, os.cpu_count() or 2)
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="prep-finalize")

    # -- what each adapter provides ------------------------------------------------------------
    def _health_fields(self) -> tuple[bool, bool, dict[str, Any]]:
        """(dead, degraded, the adapter's own fields) for ``health``."""
        raise NotImplementedError

    def _recovering(self) -> bool:
        """Whether the model side is restarting (requests wait in line meanwhile)."""
        return False

    def _stop_all(self) -> None:
        """Stop every request in flight: ``abort`` each (on the loop)."""
        for request_id in list(self._abortable):
            self.abort(request_id, "shutdown")

    @property
    def gpu_queue_depth(self) -> int:
        raise NotImplementedError

    @property
    def inference_in_progress(self) -> bool:
        raise NotImplementedError

    # -- the request -------------------------------------------------------------------------
    def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
        user: str | None = None,
        account: str | None = None,
    ) -> AsyncGenerator[Output, None]:
        """Yield ``Output``s (waiting, steps), then one with ``finish`` "done"; or raise a ``ServingError``.

        Each adapter's ``run`` is one async generator whose body runs inside ``accounted``.

        ``user`` (optional) says who asked (the page's ``request_caller`` or the HTTP APIs'
        ``http_caller``: its ``Caller.key``); the local line is fair across users and caps each one's
        waiting requests. None: a user of its own. ``account``
        (optional) is who is charged for it, the quota's key (``Caller.account``: a login wherever it
        connects from); None: ``user``.

        ``alive`` (optional) says whether the caller is still there; the liveness watch reads it
        while the request waits or infers, so a caller that vanished without a cancel leaves the
        line, or stops the model at the next step, without waiting for the next yield.
        """
        raise NotImplementedError

    # -- the one stop verb ---------------------------------------------------------------------
    def abort(self, request_id: str, reason: str = "closed") -> bool:
        """Stop one request by its id, waiting or running: the one way every stop reaches a request
        (``STOP_REASONS``). A running job stops at its next step when nobody else is left in it.
        The first reason is counted (``stops_total``); False if no such request is in flight.
        Event loop only (from another thread: ``on_loop``)."""
        held = self._abortable.get(request_id)
        if held is None:
            return False
        if held.reason is None:
            held.reason = reason
            self.metrics.stops.labels(reason).inc()
            held.stop()
        return True

    @contextlib.contextmanager
    def abortable(self, request_id: str, stop: Callable[[], None]) -> Iterator[Abortable]:
        """``request_id`` reachable by ``abort`` while the block runs (``stop`` stops it)."""
        held = self._abortable[request_id] = Abortable(stop)
        try:
            yield held
        finally:
            if self._abortable.get(request_id) is held:  # not a later request that reused the id
                del self._abortable[request_id]

    @contextlib.contextmanager
    def accounted(self) -> Iterator[Outcome]:
        """Count one request around an adapter's ``run``: in flight, its outcome, failures in a row.

        A request whose images were handed to its caller (``Outcome.delivered``, set just before the
        last ``Output`` is yielded) completed, even if its caller then closes the stream instead of
        reading it to its end (the HTTP APIs return at the done ``Output``); only a request that
        ends before that by its caller's leave is cancelled."""
        self._loop = asyncio.get_running_loop()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        outcome = Outcome()
        try:
            if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE)
            if self.max_in_flight is not None and self.in_flight > self.max_in_flight:
                raise QueueFull(self.max_in_flight)
            yield outcome
            outcome.name = "completed"
        except (InvalidRequest, RetryLater):
            outcome.name = "rejected"
            raise
        except (Cancelled, asyncio.CancelledError, GeneratorExit):
            outcome.name = "completed" if outcome.delivered else "cancelled"
            raise
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            self.metrics.jobs.labels(outcome.name).inc()
            if outcome.name == "failed":
                self.consecutive_failures += 1
            elif outcome.name == "completed":
                self.consecutive_failures = 0

    def quota_held(self, user: str | None, images: int) -> contextlib.AbstractContextManager[Held | _Uncounted]:
        """``ImageQuota.held`` when ``--quota-images-per-hour`` is on, else nothing counted (and
        nothing of ``quota`` on a request's path: ``tests/unit/test_request_path.py``)."""
        return self.quota.held(user, images) if self.quota is not None else contextlib.nullcontext(_UNCOUNTED)

    # -- health and lifecycle ------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """ok, busy, degraded (shutting down, or 3+ failures in a row), recovering (the model
        process is restarting; requests wait) or dead (no model side)."""
        dead, degraded, own = self._health_fields()
        if dead:
            status = "dead"
        elif self._recovering():
            status = "recovering"
        elif self.closing or degraded or self.consecutive_failures >= DEGRADED_AFTER:
            status = "degraded"
        elif self.inference_in_progress or self.in_flight:
            status = "busy"
        else:
            status = "ok"
        return {
            "status": status,
            "model": None if dead else self.profile.name,
            "models": [] if dead else self._models_health(),  # several models (issue 52), the default first
            "loras": [] if dead else [i.name for i in getattr(self.profile, "loras", ())],  # the --lora names
            "modes": [] if dead else list(getattr(self.profile, "modes", ("text",))),  # engine.model.modes
            "step_cache": self._step_cache_health(),
            # the --controlnet names a request's "control" may pick, "none" first (issue 51)
            "controls": [] if dead else ["none", *getattr(self.profile, "controls", ())],
            **own,
            "gpu_queue_depth": self.gpu_queue_depth,
            "inference_in_progress": self.inference_in_progress,
            "requests_in_flight": self.in_flight,
            "consecutive_failures": self.consecutive_failures,
            "shutting_down": self.closing,
        }

    def _models_health(self) -> list[dict[str, Any]]:
        """Each served model: its name (a request's ``model``), family and place ("device", "memory":
        moved off to CPU memory, "disk"), with its moves and their last times (``engine.model.shelf``)."""
        states = {s.name: s for s in self.metrics.models}
        served = getattr(self.profile, "served", (self.profile,))
        listed = []
        for i, p in enumerate(served):
            s = states.get(p.model_id)
            listed.append({"name": p.model_id, "title": p.name, "family": p.family, "pipeline": p.pipeline_class,
                           "default": i == 0, "state": s.state if s else "device", "bytes": s.bytes if s else None,
                           "loras": [info.name for info in p.loras], "controls": list(p.controls),
                           "moves": s.moves if s else 0, "last_move_in_ms": s.last_in_ms if s else 0.0,
                           "last_move_out_ms": s.last_out_ms if s else 0.0})  # fmt: skip
        return listed

    def _step_cache_health(self) -> dict[str, Any]:
        """The step-cache methods requests may name here ("auto": the first), and the server's default."""
        limits = getattr(self, "limits", None)
        methods = list(getattr(limits, "step_caches", ()))
        return {"methods": methods, "auto": methods[0] if methods else "off",
                "default": getattr(limits, "step_cache", "off")}  # fmt: skip

    def on_loop(self, fn: Callable[[], None], timeout: float = 5.0) -> None:
        """Run ``fn`` on the event loop that serves requests, and wait for it (from any thread)."""
        event_loop = self._loop
        if event_loop is None or event_loop.is_closed() or not event_loop.is_running() or _on_thread_of(event_loop):
            fn()
            return
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        event_loop.call_soon_threadsafe(call)
        if not done.wait(timeout):
            log.warning("the event loop did not run %s within %.0f s", getattr(fn, "__name__", fn), timeout)

    def begin_shutdown(self) -> None:
        """Stop admitting, answer everyone waiting, stop running jobs at their next step. Any thread."""

        def begin() -> None:
            self.closing = True
            self._stop_all()

        self.on_loop(begin)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the adapter closes (the app hangs its helpers' shutdown here)."""
        self._on_close.append(callback)

    def close(self) -> None:
        for callback in self._on_close:
            callback()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.decoder.close()


def _on_thread_of(event_loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is event_loop
    except RuntimeError:
        return False

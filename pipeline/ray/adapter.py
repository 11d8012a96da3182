"""The front end over Ray Serve replicas: the ``Adapter`` protocol, the same gate on every replica.

``RayAdapter`` validates on the front end first (a bad field never reaches a replica), streams the
replica's steps back (Ray Serve streaming responses), cancels the remote call when its caller
leaves (Ray cancels the replica's task, whose ``LocalAdapter`` sets the job's stop: the model
stops at its next step), writes the PNGs the replica encoded into the front end's output folder,
and keeps the error classes: validation, queue full, out of memory, replica dead. The info record
names the replica that ran the job. Accounting, health, close hooks, the liveness watch and the
"k ahead" line are ``AdapterBase``'s and ``WaitLine``'s, as for ``LocalAdapter``.

Owners: the event loop owns the line, ``running`` and the open calls; the ``ray-status`` thread
owns ``replicas_running``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from functools import partial
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Mapping, Sequence

from ..config import Settings
from ..errors import (
    Cancelled,
    GenerationFailed,
    OutOfMemory,
    QueueFull,
    ReplicaDead,
    ServingError,
    ShuttingDown,
)
from ..protocol import ModelProfile, Output
from ..request import has_pictures, limits_for, validate, with_pictures
from ..serving.base import SHUTDOWN_MESSAGE, AdapterBase
from ..serving.metrics import Metrics
from ..serving.postprocess import output_folder, write_then_rename
from ..serving.scheduler import WaitLine
from .cluster import RayCluster, stop
from .replica import started_by_replica

log = logging.getLogger(__name__)

STATUS_POLL_SECONDS = 2.0
STOP_SECONDS = 10.0  # the most the app waits for Ray to tear down at exit
RETRIES_BEFORE_START = 2  # a request whose replica died before it started is sent again this often


# -- the front end ---------------------------------------------------------------------------------
def classify(error: BaseException, request_id: str, queue_size: int | None = None) -> BaseException:
    """Ray's errors in our classes: queue full, replica dead, out of memory; a replica's own error as is."""
    from ray import exceptions as rx
    from ray.serve import exceptions as sx

    if isinstance(error, ServingError):
        return error
    if isinstance(error, sx.BackPressureError):
        return QueueFull(queue_size)
    if isinstance(error, rx.RayTaskError):
        cause = error.cause if isinstance(error.cause, BaseException) else None
        if isinstance(cause, ServingError):
            return cause
        if cause is not None and not isinstance(cause, rx.RayTaskError):
            return classify(cause, request_id, queue_size)
        return GenerationFailed(request_id)
    if isinstance(error, (sx.RequestCancelledError, rx.TaskCancelledError, asyncio.CancelledError)):
        return Cancelled("the remote job was cancelled")
    if isinstance(error, rx.OutOfMemoryError):
        return OutOfMemory(request_id)
    if isinstance(
        error,
        (
            rx.RayActorError,
            rx.ActorUnavailableError,
            sx.ReplicaUnavailableError,
            sx.DeploymentUnavailableError,
            rx.WorkerCrashedError,
        ),
    ):
        return ReplicaDead(request_id)
    return GenerationFailed(request_id)


class RayAdapter(AdapterBase):
    """The ``Adapter`` protocol over a Ray Serve deployment of ``ModelReplica``."""

    def __init__(self, cluster: RayCluster, settings: Settings, *, pool_threads: int | None = None) -> None:
        self._line: WaitLine[None] = WaitLine()
        self.running = 0  # requests a replica has started
        super().__init__(Metrics(lambda: self.gpu_queue_depth, lambda: self.running), pool_threads=pool_threads)
        self.cluster = cluster
        self.handle = cluster.handle.options(stream=True)
        self.profile: ModelProfile = cluster.handle.profile.remote().result()
        self.limits = limits_for(settings, self.profile)
        self.output_dir = settings.output_dir
        self.queue_size = settings.queue_size
        self._calls: set[Any] = set()  # the open remote calls, cancelled on shutdown
        self.started: dict[
            str, dict[str, Any]
        ] = {}  # request id -> the replica running it (its name, pid), while it runs
        self.replicas_running: int | None = None  # from Serve's status, refreshed in the background
        self._status_stop = threading.Event()
        self._status_thread = threading.Thread(target=self._watch_status, name="ray-status", daemon=True)
        self._status_thread.start()

    @property
    def gpu_queue_depth(self) -> int:
        return len(self._line.tickets)

    @property
    def inference_in_progress(self) -> bool:
        return self.running > 0

    # -- health and lifecycle ----------------------------------------------------------------------
    def _watch_status(self) -> None:
        from ray import serve

        while not self._status_stop.wait(0 if self.replicas_running is None else STATUS_POLL_SECONDS):
            try:
                app = serve.status().applications[self.cluster.app_name]
                replicas = app.deployments["ModelReplica"].replica_states
                self.replicas_running = int(replicas.get("RUNNING", 0))  # type: ignore[call-overload]  # a str enum
            except Exception:
                self.replicas_running = 0

    def _health_fields(self) -> tuple[bool, bool, dict[str, Any]]:
        running = self.replicas_running
        own = {"backend": "ray", "replicas": self.cluster.replicas, "replicas_running": running, "model_hung": False}
        return running == 0, running is not None and running < self.cluster.replicas, own

    def _stop_all(self) -> None:
        super()._stop_all()  # every request through ``abort``
        for call in list(self._calls):  # and any call between its request's attempts
            _cancel(call)

    def shutdown_model(self, timeout: float | None = None) -> None:
        """Delete the deployment (and the local Ray this app started), waiting at most ``timeout`` s.

        Bounded: a Ctrl-C in a terminal also reaches the local Ray's own processes (same process
        group), and then Serve's blocking delete would wait forever for a controller that is gone.
        """
        self._status_stop.set()
        stopper = threading.Thread(target=stop, args=(self.cluster,), name="ray-stop", daemon=True)
        stopper.start()
        stopper.join(max(timeout or 0, STOP_SECONDS))
        if stopper.is_alive():
            log.warning("Ray did not shut down within %.0f s; exiting without it", max(timeout or 0, STOP_SECONDS))

    def close(self) -> None:
        self._status_stop.set()
        super().close()

    # -- the request -----------------------------------------------------------------------------
    async def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
        user: str | None = None,  # the disk share and the decode turn: Ray Serve's own queue orders the replicas'
        account: str | None = None,
    ) -> AsyncGenerator[Output, None]:
        """One request through a replica; see ``Adapter.run``."""
        with self.accounted() as outcome, contextlib.ExitStack() as cleanup:
            event_loop = asyncio.get_running_loop()
            # 1. Prepare on the front end: a bad field is answered here, before any replica sees it. The
            #    seed is resolved here too, so the replica draws exactly what the caller will be told.
            #    Gates before work, as ``LocalAdapter.run``: the fields, then the quota, then the
            #    pictures, on the decode threads.
            request = validate(raw, self.limits, request_id=request_id, pictures_later=True)
            held = cleanup.enter_context(self.quota_held(account or user, request.num_images))
            if has_pictures(raw):
                request = await self.decoder.run(user, with_pictures, request, raw, self.limits)
            forward = {**dict(raw), "seed": request.seed, "randomize_seed": False}
            ticket = self._line.join(None)
            started: dict[str, Any] | None = None
            done: Output | None = None
            try:
                for attempt in range(RETRIES_BEFORE_START + 1):
                    call = self._handle_for(request.model).generate.remote(forward, request.request_id)
                    self._calls.add(call)
                    gone = asyncio.Event()

                    def caller_gone(call: Any = call, gone: asyncio.Event = gone) -> None:
                        gone.set()
                        _cancel(call)

                    with self.abortable(request.request_id, caller_gone):
                        try:
                            with self.liveness.watching(alive, lambda: self.abort(request.request_id, "gone")):
                                # 2./3. Wait for a replica, then relay its steps.
                                async for item in self._relay(call, ticket):
                                    if started_by_replica(item):
                                        started = item.info
                                        self.started[request.request_id] = item.info
                                        self._line.leave(ticket)
                                        self.running += 1
                                        self._line.notify()
                                    elif item.kind == "done":
                                        done = item
                                    else:
                                        if item.step:  # a step has run: the quota is spent
                                            held.ran()
                                        yield item
                            break
                        except BaseException as exc:
                            if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
                                self.abort(request.request_id, "closed")  # the caller closed its stream
                                raise
                            _cancel(call)
                            if gone.is_set() and not self.closing:
                                raise Cancelled("the caller went away") from None
                            error = classify(exc, request.request_id, self.queue_size)
                            if self.closing and not isinstance(error, ShuttingDown):
                                raise ShuttingDown(SHUTDOWN_MESSAGE + " Your job was stopped.") from None
                            if isinstance(error, ReplicaDead) and started is None and attempt < RETRIES_BEFORE_START:
                                log.warning(
                                    "request %s: its replica went away before starting it; sending it again",
                                    request.request_id,
                                )
                                continue
                            if isinstance(error, ReplicaDead):
                                log.error(
                                    "request %s: the replica %s died during the job",
                                    request.request_id,
                                    started["replica"] if started else "?",
                                )
                            raise error from None
                        finally:
                            self._calls.discard(call)
            finally:
                self._line.leave(ticket)
                self.started.pop(request.request_id, None)
                if started is not None:
                    self.running -= 1
                self._line.notify()
            if done is None:
                raise GenerationFailed(request.request_id)
            # 4. Finalize on the front end: write the replica's PNGs where the app serves files from.
            paths = await event_loop.run_in_executor(self._pool, self._write, done.files, user)
            first_pass = await event_loop.run_in_executor(self._pool, self._write, done.first_pass_files, user)
            info = dict(done.info)
            info["backend"] = "ray"
            self.metrics.images.inc(len(paths))
            self.metrics.inference.observe(info["durations_ms"]["inference"] / 1000)
            held.keep()
            outcome.delivered = True
            yield Output(request.request_id, finish="done", paths=tuple(paths), info=info, first_pass=tuple(first_pass))

    async def _relay(self, call: Any, ticket: int) -> AsyncGenerator[Output, None]:
        """The remote stream; until the replica starts the request, its place as the line moves."""
        first = asyncio.ensure_future(call.__anext__())
        first.add_done_callback(_retrieve)  # its error is re-raised below, or moot once we cancel
        first.add_done_callback(lambda _f: self._line.notify())  # the wait below wakes up for it
        try:
            async for waiting in self._line.turn(
                ticket, busy=lambda: int(self.running >= self.cluster.replicas), done=lambda _ahead: first.done()
            ):
                yield waiting
            yield Output(ahead=0)
            item = first.result()
        except StopAsyncIteration:
            return
        finally:
            if not first.done():
                first.cancel()
        yield item
        async for item in call:
            if item.kind == "step":
                self.metrics.denoise_steps.inc()
            yield item

    def _handle_for(self, model: str) -> Any:
        """The handle a request's call goes through: with several models, tagged with its model
        (``multiplexed_model_id``), so Serve routes it to a replica holding that model (issue 52)."""
        if not self.profile.models:
            return self.handle
        return self.handle.options(multiplexed_model_id=model or self.profile.model_id)

    def _write(self, files: Sequence[tuple[str, bytes]], user: str | None) -> list[Path]:
        folder = output_folder(self.output_dir, user)
        return [write_then_rename(folder / name, partial(_write_bytes, png)) for name, png in files]


def _write_bytes(data: bytes, path: Path) -> None:
    path.write_bytes(data)


def _cancel(call: Any) -> None:
    """Cancel a remote call: before assignment it leaves Ray's queue; after, Ray cancels the replica's task.

    ``cancel`` re-raises the call's own stored error (a ``BackPressureError``, say); that error is
    handled where the call is read, so here it is moot. It never blocks: an unassigned call's
    future is still pending, and an assigned call's is done.
    """
    with contextlib.suppress(Exception):
        call.cancel()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()

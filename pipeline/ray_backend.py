"""Past one GPU: the same gate on every replica, scaled out with Ray Serve.

The model side becomes a Ray Serve deployment, ``ModelReplica``. Each replica owns one device,
loads the model once on its own ``gpu-worker`` thread and runs a ``LocalAdapter`` around it: the
same validation, the same ``asyncio.Semaphore(1)`` gate around the inference only, the same
dynamic batching and the same PNG encoding as the one-GPU app. Ray Serve routes each request to
a replica and bounds admission:

- ``max_ongoing_requests = max_batch_size``: a replica admits as many requests as one batch can
  carry, so compatible requests meet inside it; its gate still runs one inference at a time. With
  ``--max-batch-size 1`` this is exactly ``max_ongoing_requests=1``.
- ``max_queued_requests = queue_size``: past that, Ray answers ``BackPressureError``, which turns
  into our ``QueueFull`` ("the queue is full, retry in a moment").

``RayAdapter`` is the front end's side. It has the ``LocalAdapter`` interface (``run`` yields
``Waiting``/``Step`` and one ``Done``, ``health``, ``metrics``, ``begin_shutdown``, ``close``), so
the Gradio app does not change. It validates on the front end first (a bad field never reaches a
replica), streams the replica's steps back (Ray Serve streaming responses), cancels the remote
call when its caller leaves (Ray cancels the replica's task, whose ``LocalAdapter`` sets the job's
stop event: the model stops at its next step), writes the PNGs the replica encoded into the
front end's output folder, and keeps the error classes: validation, queue full, out of memory,
replica dead. The info record names the replica that ran the job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from .adapter import SHUTDOWN_MESSAGE, Done, Event, Step, Waiting, accounted
from .config import Settings
from .errors import (
    Cancelled,
    GenerationFailed,
    OutOfMemory,
    QueueFull,
    ReplicaDead,
    ServingError,
    ShuttingDown,
)
from .metrics import Metrics
from .protocol import ModelProfile
from .request import Limits, limits_for, validate

log = logging.getLogger(__name__)

APP_NAME = "t2i"
REPO_ROOT = Path(__file__).resolve().parent.parent
ALIVE_POLL_SECONDS = 0.02
STATUS_POLL_SECONDS = 2.0
STOP_SECONDS = 10.0  # the most the app waits for Ray to tear down at exit
RETRIES_BEFORE_START = 2  # a request whose replica died before it started is sent again this often


# -- what crosses the boundary (plain picklable records) -----------------------------------------
@dataclass(frozen=True)
class Started:
    """The replica took the request: who it is."""

    replica: str
    actor_name: str
    pid: int


@dataclass(frozen=True)
class RemoteDone:
    """The request's PNGs (encoded in the replica, with their parameters) and its info record."""

    names: tuple[str, ...]
    pngs: tuple[bytes, ...]
    info: dict[str, Any]


# -- the replica ---------------------------------------------------------------------------------
class ModelReplica:
    """One replica: one device, the model loaded once, one inference at a time (its own gate).

    Wrapped by ``serve.deployment`` in ``deployment()``; kept a plain class so it imports without
    Ray and its logic is the ``LocalAdapter``'s.
    """

    def __init__(self, settings: Settings) -> None:
        from .adapter import LocalAdapter
        from .model import load_model
        from .worker import GpuWorker

        self.name, self.actor_name = _replica_identity()
        out = Path(tempfile.mkdtemp(prefix="t2i-replica-"))
        worker = GpuWorker(lambda: load_model(settings))
        profile = worker.start()
        self.adapter = LocalAdapter(worker, limits_for(settings, profile), out, job_timeout=settings.job_timeout,
                                    max_batch_size=settings.max_batch_size)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replica-io")
        log.info("replica %s ready: %s on %s", self.name, profile.name, profile.device)

    def profile(self) -> ModelProfile:
        return self.adapter.profile

    def health(self) -> dict[str, Any]:
        return {**self.adapter.health(), "replica": self.name, "pid": os.getpid()}

    def stats(self) -> dict[str, Any]:
        """This replica's counters (tests and operators: which replica ran what, and how a cancel ended)."""
        registry = self.adapter.metrics.registry

        def value(name: str, **labels: str) -> float:
            return float(registry.get_sample_value(name, labels) or 0.0)

        return {
            "replica": self.name,
            "pid": os.getpid(),
            "denoise_steps": value("denoise_steps_total"),
            "jobs": {o: value("jobs_total", outcome=o) for o in ("completed", "cancelled", "failed", "rejected")},
            "steps_after_stop_count": value("steps_after_stop_count"),
            "steps_after_stop_sum": value("steps_after_stop_sum"),
            "inference_in_progress": self.adapter.inference_in_progress,
        }

    async def generate(self, raw: dict[str, Any], request_id: str) -> AsyncIterator[Started | Step | RemoteDone]:
        """Stream one request: ``Started``, its ``Step``s, then ``RemoteDone`` (or raise a ``ServingError``).

        When the caller cancels, Ray cancels this task; closing ``adapter.run`` sets the job's stop
        event, and the model thread stops at the end of the step in progress.
        """
        yield Started(self.name, self.actor_name, os.getpid())
        loop = asyncio.get_running_loop()
        async with contextlib.aclosing(self.adapter.run(raw, request_id=request_id)) as events:
            async for event in events:
                if isinstance(event, Step):
                    yield event
                elif isinstance(event, Done):
                    pngs = await loop.run_in_executor(self._pool, _take_files, event.paths)
                    info = {**event.info, "replica": self.name}
                    yield RemoteDone(tuple(p.name for p in event.paths), pngs, info)
                # Waiting: the front end reports the line it can see (see RayAdapter).

    def shutdown(self) -> None:
        self.adapter.begin_shutdown()
        self.adapter.worker.shutdown(timeout=5)
        self.adapter.close()


def _take_files(paths: list[Path]) -> tuple[bytes, ...]:
    blobs = []
    for path in paths:
        blobs.append(path.read_bytes())
        path.unlink(missing_ok=True)
    return tuple(blobs)


def _replica_identity() -> tuple[str, str]:
    try:
        from ray import get_runtime_context, serve

        replica_id = serve.get_replica_context().replica_id
        return str(getattr(replica_id, "unique_id", replica_id)), get_runtime_context().get_actor_name() or ""
    except Exception:  # noqa: BLE001 - outside Ray (tests of the class itself)
        return f"local-{os.getpid()}", ""


# -- starting Ray and the deployment ---------------------------------------------------------------
@dataclass
class RayCluster:
    """What ``start`` set up, so ``stop`` undoes exactly that."""

    handle: Any
    replicas: int
    started_ray: bool
    replica_cpus: float
    replica_gpus: float
    app_name: str = APP_NAME


def replica_resources(settings: Settings, cluster: Mapping[str, float]) -> tuple[float, float]:
    """(CPUs, GPUs) per replica: the settings, or the cluster split evenly (one GPU each where there are GPUs)."""
    gpus = settings.replica_gpus
    if gpus is None:
        gpus = 1.0 if cluster.get("GPU", 0) >= settings.replicas and settings.device in ("auto", "cuda") else 0.0
    cpus = settings.replica_cpus
    if cpus is None:
        cpus = max(1.0, float(int(cluster.get("CPU", 1) // settings.replicas)))
    return cpus, gpus


def start(settings: Settings, app_name: str = APP_NAME) -> RayCluster:
    """Connect to ``settings.ray_address`` or start a local Ray (no dashboard), then deploy the replicas."""
    import ray
    from ray import serve

    started = False
    if not ray.is_initialized():
        if settings.ray_address:
            # A real cluster: ship this checkout to the workers.
            runtime_env = {"working_dir": str(REPO_ROOT),
                           "excludes": [".git", "test-artifacts", "bench/results", "__pycache__"]}
            ray.init(address=settings.ray_address, runtime_env=runtime_env, log_to_driver=False)
        else:
            # Local: the workers import this checkout from the same disk.
            path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_SERVE_LOG_TO_STDERR": "0"}})
        started = True
    cpus, gpus = replica_resources(settings, ray.cluster_resources())
    per_replica = settings
    if settings.torch_threads is None:
        per_replica = dataclasses.replace(settings, torch_threads=max(1, int(cpus)))
    serve.start(proxy_location="Disabled")
    app = deployment().options(
        num_replicas=settings.replicas,
        max_ongoing_requests=settings.max_batch_size,
        max_queued_requests=settings.queue_size,
        ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
        health_check_period_s=2.0,
        graceful_shutdown_timeout_s=5.0,
    ).bind(per_replica)
    handle = serve.run(app, name=app_name, route_prefix=None)
    return RayCluster(handle, settings.replicas, started, cpus, gpus, app_name)


def stop(cluster: RayCluster) -> None:
    import ray
    from ray import serve

    with contextlib.suppress(Exception):
        serve.delete(cluster.app_name)
    if cluster.started_ray:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


_DEPLOYMENT: Any = None


def deployment() -> Any:
    """``ModelReplica`` as a Ray Serve deployment (built once, when Ray is first needed)."""
    global _DEPLOYMENT
    if _DEPLOYMENT is None:
        from ray import serve

        _DEPLOYMENT = serve.deployment(name="ModelReplica")(ModelReplica)
    return _DEPLOYMENT


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
    if isinstance(error, (rx.RayActorError, rx.ActorUnavailableError, sx.ReplicaUnavailableError,
                          sx.DeploymentUnavailableError, rx.WorkerCrashedError)):
        return ReplicaDead(request_id)
    return GenerationFailed(request_id)


class RayAdapter:
    """The ``LocalAdapter`` interface over a Ray Serve deployment of ``ModelReplica``."""

    def __init__(self, cluster: RayCluster, settings: Settings, *, pool_threads: int = 2) -> None:
        self.cluster = cluster
        self.handle = cluster.handle.options(stream=True)
        self._profile: ModelProfile = cluster.handle.profile.remote().result()
        self.limits: Limits = limits_for(settings, self._profile)
        self.output_dir = settings.output_dir
        self.queue_size = settings.queue_size
        self.closing = False
        self.consecutive_failures = 0
        self.in_flight = 0
        self.running = 0  # requests a replica has started
        self._unstarted: dict[int, None] = {}  # tickets sent and not started yet, in order
        self._tickets = iter(range(2**62))
        self._moved = asyncio.Event()
        self._calls: set[Any] = set()  # the open remote calls, cancelled on shutdown
        self.started: dict[str, Started] = {}  # request id -> the replica running it, while it runs
        self._on_close: list[Callable[[], None]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(pool_threads, thread_name_prefix="prep-finalize")
        self.replicas_running: int | None = None  # from Serve's status, refreshed in the background
        self._status_stop = threading.Event()
        self._status_thread = threading.Thread(target=self._watch_status, name="ray-status", daemon=True)
        self._status_thread.start()
        self.metrics = Metrics(lambda: len(self._unstarted), lambda: self.running)

    @property
    def profile(self) -> ModelProfile:
        return self._profile

    @property
    def gpu_queue_depth(self) -> int:
        return len(self._unstarted)

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
                self.replicas_running = int(replicas.get("RUNNING", 0))
            except Exception:  # noqa: BLE001 - Ray is gone or going
                self.replicas_running = 0

    def health(self) -> dict[str, Any]:
        running = self.replicas_running
        if running == 0:
            status = "dead"
        elif self.closing or self.consecutive_failures >= 3 or (running is not None and running < self.cluster.replicas):
            status = "degraded"
        elif self.in_flight:
            status = "busy"
        else:
            status = "ok"
        return {
            "status": status,
            "model": self._profile.name,
            "backend": "ray",
            "replicas": self.cluster.replicas,
            "replicas_running": running,
            "gpu_queue_depth": self.gpu_queue_depth,
            "inference_in_progress": self.inference_in_progress,
            "requests_in_flight": self.in_flight,
            "consecutive_failures": self.consecutive_failures,
            "model_hung": False,
            "shutting_down": self.closing,
        }

    def begin_shutdown(self) -> None:
        self.closing = True
        for call in list(self._calls):
            _cancel(call)

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

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
        for callback in self._on_close:
            callback()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the request -----------------------------------------------------------------------------
    async def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> AsyncIterator[Event]:
        """As ``LocalAdapter.run``: ``Waiting``/``Step`` progress, then one ``Done``; or a ``ServingError``."""
        async with contextlib.aclosing(accounted(self, self._stages(raw, request_id, alive))) as events:
            async for event in events:
                yield event

    async def _stages(
        self, raw: Mapping[str, Any], request_id: str | None, alive: Callable[[], bool] | None
    ) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        if self.closing:
            raise ShuttingDown(SHUTDOWN_MESSAGE)
        # 1. Prepare on the front end: a bad field is answered here, before any replica sees it. The
        #    seed is resolved here too, so the replica draws exactly what the caller will be told.
        request = await loop.run_in_executor(self._pool, lambda: validate(raw, self.limits, request_id=request_id))
        forward = {**dict(raw), "seed": request.seed, "randomize_seed": False}
        ticket = next(self._tickets)
        self._unstarted[ticket] = None
        self._notify()
        started: Started | None = None
        done: RemoteDone | None = None
        try:
            for attempt in range(RETRIES_BEFORE_START + 1):
                call = self.handle.generate.remote(forward, request.request_id)
                self._calls.add(call)
                watcher = asyncio.create_task(self._watch(alive, call)) if alive is not None else None
                try:
                    async for item in self._relay(call, ticket):
                        if isinstance(item, Started):
                            started = item
                            self.started[request.request_id] = item
                            self._unstarted.pop(ticket, None)
                            self.running += 1
                            self._notify()
                        elif isinstance(item, RemoteDone):
                            done = item
                        else:
                            yield item
                    break
                except BaseException as exc:
                    _cancel(call)
                    if watcher is not None and watcher.done() and not watcher.cancelled():
                        raise Cancelled("the caller went away") from None
                    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
                        raise
                    error = classify(exc, request.request_id, self.queue_size)
                    if self.closing and not isinstance(error, ShuttingDown):
                        raise ShuttingDown(SHUTDOWN_MESSAGE + " Your job was stopped.") from None
                    if isinstance(error, ReplicaDead) and started is None and attempt < RETRIES_BEFORE_START:
                        log.warning("request %s: its replica went away before starting it; sending it again",
                                    request.request_id)
                        continue
                    if isinstance(error, ReplicaDead):
                        log.error("request %s: the replica %s died during the job", request.request_id,
                                  started.replica if started else "?")
                    raise error from None
                finally:
                    self._calls.discard(call)
                    if watcher is not None:
                        watcher.cancel()
        finally:
            self._unstarted.pop(ticket, None)
            self.started.pop(request.request_id, None)
            if started is not None:
                self.running -= 1
            self._notify()
        if done is None:
            raise GenerationFailed(request.request_id)
        # 4. Finalize on the front end: write the replica's PNGs where the app serves files from.
        paths = await loop.run_in_executor(self._pool, self._write, done)
        info = dict(done.info)
        info["backend"] = "ray"
        self.metrics.images.inc(len(paths))
        self.metrics.inference.observe(info["durations_ms"]["inference"] / 1000)
        yield Done(paths, info)

    async def _relay(self, call: Any, ticket: int) -> AsyncIterator[Any]:
        """The remote stream; until the replica starts the request, ``Waiting`` as the line moves."""
        first = asyncio.ensure_future(call.__anext__())
        first.add_done_callback(_retrieve)  # its error is re-raised below, or moot once we cancel
        try:
            reported = -1
            while not first.done():
                ahead = self._ahead(ticket)
                if ahead != reported:
                    reported = ahead
                    yield Waiting(ahead)
                moved = self._moved
                waiter = asyncio.ensure_future(moved.wait())
                try:
                    await asyncio.wait({first, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
            if reported != 0:
                yield Waiting(0)
            item = first.result()
        except StopAsyncIteration:
            return
        finally:
            if not first.done():
                first.cancel()
        yield item
        async for item in call:
            if isinstance(item, Step):
                self.metrics.denoise_steps.inc()
            yield item

    def _ahead(self, ticket: int) -> int:
        """Requests before this one that no replica has started, plus one if every replica is busy."""
        before = sum(1 for t in self._unstarted if t < ticket)
        return before + int(self.running >= self.cluster.replicas)

    def _notify(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()

    async def _watch(self, alive: Callable[[], bool], call: Any) -> None:
        while alive():
            await asyncio.sleep(ALIVE_POLL_SECONDS)
        log.info("the caller went away: cancelling its remote job")
        _cancel(call)

    def _write(self, done: RemoteDone) -> list[Path]:
        day = self.output_dir / time.strftime("%Y%m%d", time.gmtime())
        day.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, png in zip(done.names, done.pngs):
            path = day / name
            tmp = path.with_suffix(".png.tmp")
            tmp.write_bytes(png)
            tmp.replace(path)
            paths.append(path)
        return paths


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

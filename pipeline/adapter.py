"""The adapter between the I/O side (many concurrent requests) and the one model thread.

``LocalAdapter.run`` is an async generator that walks one request through four stages:

1. prepare   (concurrent) validate the raw values, resolve the seed, count prompt tokens
2. wait      in line for the GPU, reporting "k ahead" whenever k changes
3. infer     (serial) ``async with asyncio.Semaphore(1)``: hand the job to the model thread and
             stream its steps back
4. finalize  (concurrent) encode PNGs with their parameters, build the info record

Only stage 3 is inside the gate. Stages 1 and 4 run in the adapter's own small thread pool, so the
event loop never does more than bookkeeping. If the consumer stops (cancel, disconnect, close),
the model thread is told through a ``threading.Event`` and the gate is held until that thread has
really returned: never two inferences at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from PIL import Image

from .errors import (
    Cancelled,
    GenerationFailed,
    InvalidRequest,
    JobTimedOut,
    OutOfMemory,
    RetryLater,
    ServingError,
    ShuttingDown,
)
from .metrics import Metrics
from .postprocess import encode_pngs, sampler_name
from .protocol import InferenceResult, ModelProfile
from .request import GenerateRequest, Limits, validate
from .worker import GpuWorker

log = logging.getLogger(__name__)

DEGRADED_AFTER = 3  # consecutive failed jobs
TIMEOUT_GRACE_SECONDS = 2.0  # after a time limit, how long to wait for the thread to stop
ALIVE_POLL_SECONDS = 0.02  # how often a request checks that its caller is still there
SHUTDOWN_MESSAGE = "The server is shutting down; please retry in a moment."


@dataclass(frozen=True)
class Waiting:
    """Prepared and in line for the GPU; ``ahead`` jobs (the running one included) come first."""

    ahead: int


@dataclass(frozen=True)
class Step:
    step: int
    total: int
    preview: Image.Image | None = None


@dataclass(frozen=True)
class Done:
    paths: list[Path]
    info: dict[str, Any]


Event = Waiting | Step | Done


@dataclass
class _Line:
    """Who waits for the gate, in arrival order, with a wake-up whenever the line or the gate moves."""

    tickets: dict[int, None] = field(default_factory=dict)
    counter: itertools.count = field(default_factory=itertools.count)
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def join(self) -> int:
        ticket = next(self.counter)
        self.tickets[ticket] = None
        return ticket

    def leave(self, ticket: int) -> None:
        if self.tickets.pop(ticket, 0) is None:
            self.notify()

    def before(self, ticket: int) -> int:
        return sum(1 for t in self.tickets if t < ticket)

    def notify(self) -> None:
        self.moved.set()
        self.moved = asyncio.Event()


class LocalAdapter:
    """Runs requests against one ``GpuWorker``; the gate wraps only the inference."""

    def __init__(
        self,
        worker: GpuWorker,
        limits: Limits,
        output_dir: Path,
        *,
        pool_threads: int = 2,
        clock: Callable[[], float] = time.time,
        encode: Callable[..., list[Path]] = encode_pngs,
        job_timeout: float | None = None,
    ) -> None:
        self.worker = worker
        self.limits = limits
        self.output_dir = output_dir
        self._clock = clock
        self._encode_pngs = encode
        self.job_timeout = job_timeout
        self.model_hung = False  # a job ran past its limit and its thread has not returned yet
        self._on_close: list[Callable[[], None]] = []
        self._gate = asyncio.Semaphore(1)
        self._line = _Line()
        self._running: dict[str, threading.Event] = {}  # request id -> its stop event
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closing = False
        self.consecutive_failures = 0
        self.in_flight = 0
        self.metrics = Metrics(lambda: self.gpu_queue_depth, lambda: int(self.inference_in_progress))
        # Short CPU work (validation, token counting, PNG encoding) off the event loop, on threads
        # this adapter names and owns.
        self._pool = concurrent.futures.ThreadPoolExecutor(pool_threads, thread_name_prefix="prep-finalize")

    @property
    def profile(self) -> ModelProfile:
        return self.worker.model.profile

    @property
    def gpu_queue_depth(self) -> int:
        """Prepared requests waiting for the gate."""
        return len(self._line.tickets)

    @property
    def inference_in_progress(self) -> bool:
        return self._gate.locked()

    def health(self) -> dict[str, Any]:
        """ok, busy, degraded (shutting down, or 3+ failures in a row) or dead (no model thread)."""
        if not self.worker.alive:
            status = "dead"
        elif self.closing or self.model_hung or self.consecutive_failures >= DEGRADED_AFTER:
            status = "degraded"
        elif self.inference_in_progress or self.in_flight:
            status = "busy"
        else:
            status = "ok"
        model = self.worker.model.profile.name if self.worker.alive else None
        return {
            "status": status,
            "model": model,
            "gpu_queue_depth": self.gpu_queue_depth,
            "inference_in_progress": self.inference_in_progress,
            "requests_in_flight": self.in_flight,
            "consecutive_failures": self.consecutive_failures,
            "model_hung": self.model_hung,
            "shutting_down": self.closing,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Stop admitting, answer everyone waiting, stop the running job at its next step.

        Safe to call from any thread (a signal handler's, say).
        """
        self.closing = True
        for stop in list(self._running.values()):
            stop.set()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._line.notify)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the adapter closes (the app hangs its helpers' shutdown here)."""
        self._on_close.append(callback)

    def close(self) -> None:
        for callback in self._on_close:
            callback()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the request -------------------------------------------------------------------------
    async def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> AsyncIterator[Event]:
        """Yield ``Waiting``/``Step`` progress, then one ``Done``; or raise a ``ServingError``.

        ``alive`` (optional) says whether the caller is still there; it is polled while the request
        waits or infers, so a caller that vanished without a cancel leaves the line, or stops the
        model at the next step, without waiting for the next yield to find out.
        """
        self._loop = asyncio.get_running_loop()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        outcome = "failed"
        try:
            async with contextlib.aclosing(self._stages(raw, request_id, alive)) as stages:
                async for event in stages:
                    yield event
            outcome = "completed"
        except (InvalidRequest, RetryLater):
            outcome = "rejected"
            raise
        except (Cancelled, asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            self.metrics.jobs.labels(outcome).inc()
            if outcome == "failed":
                self.consecutive_failures += 1
            elif outcome == "completed":
                self.consecutive_failures = 0

    async def _stages(
        self, raw: Mapping[str, Any], request_id: str | None, alive: Callable[[], bool] | None
    ) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        t: dict[str, float] = {"received": self._clock()}
        if self.closing:
            raise ShuttingDown(SHUTDOWN_MESSAGE)
        stop = threading.Event()  # set: the model thread stops this job at its next step
        watcher = asyncio.create_task(self._watch(alive, stop)) if alive is not None else None
        try:
            async with contextlib.aclosing(self._gated(loop, t, raw, request_id, stop)) as gated:
                async for event in gated:
                    yield event
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _watch(self, alive: Callable[[], bool], stop: threading.Event) -> None:
        while not stop.is_set():
            if not alive():
                log.info("the caller went away: stopping its request")
                stop.set()
                self._line.notify()
                return
            await asyncio.sleep(ALIVE_POLL_SECONDS)

    async def _gated(
        self,
        loop: asyncio.AbstractEventLoop,
        t: dict[str, float],
        raw: Mapping[str, Any],
        request_id: str | None,
        stop: threading.Event,
    ) -> AsyncIterator[Event]:
        # 1. Prepare: concurrent, off the loop. A bad field fails here, before any GPU work.
        t["prepare_start"] = self._clock()
        request = await loop.run_in_executor(self._pool, self._prepare, raw, request_id)
        t["prepare_end"] = self._clock()

        # 2. Wait in line for the GPU, telling the caller how many are ahead as that changes.
        t["gpu_wait_start"] = self._clock()
        ticket = self._line.join()
        try:
            reported = -1
            while True:
                moved = self._line.moved  # taken before the check, so no wake-up is missed
                ahead = self._line.before(ticket) + int(self._gate.locked())
                if not ahead or self.closing or stop.is_set():
                    break
                if ahead != reported:
                    reported = ahead
                    yield Waiting(ahead)
                await moved.wait()
            if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE)
            if stop.is_set():
                raise Cancelled("the caller went away while waiting")
            if reported != 0:
                yield Waiting(0)
            # First in line and the gate is free; nothing awaits between that check and this
            # acquire, so nobody can overtake.
            async with self._gate:
                self._line.leave(ticket)
                # 3. Infer: serial, on the model thread.
                self._running[request.request_id] = stop
                events, future = self._submit(request, stop, loop)
                deadline = None if self.job_timeout is None else loop.time() + self.job_timeout
                try:
                    while (event := await _next(events, deadline, loop)) is not None:
                        yield event
                except asyncio.TimeoutError:
                    # Past the limit: stop at the next step. A thread stuck inside one step cannot
                    # be interrupted; the caller is answered anyway, and the single model thread
                    # still keeps the next job from running beside the stuck one.
                    stop.set()
                    assert self.job_timeout is not None
                    if not await _until_done(future, timeout=TIMEOUT_GRACE_SECONDS):
                        self._mark_hung(future)
                    raise JobTimedOut(request.request_id, self.job_timeout) from None
                except BaseException:
                    # Cancelled, disconnected or closed: stop at the next step boundary, and keep
                    # the gate until the model thread has really returned.
                    stop.set()
                    await _until_done(future)
                    raise
                finally:
                    self._running.pop(request.request_id, None)
                result = self._outcome(request, future)
        finally:
            self._line.leave(ticket)
            self._line.notify()  # the gate may have opened: wake the line
        t["infer_start"], t["infer_end"] = result.started, result.ended

        # 4. Finalize: concurrent, off the loop.
        t["finalize_start"] = self._clock()
        paths = await loop.run_in_executor(self._pool, self._encode, request, result)
        t["finalize_end"] = self._clock()
        info = self._info(request, result, t)
        self._observe(info, len(paths))
        yield Done(paths, info)

    # -- stages ------------------------------------------------------------------------------
    def _prepare(self, raw: Mapping[str, Any], request_id: str | None) -> GenerateRequest:
        return validate(raw, self.limits, self.worker.model.count_tokens, request_id=request_id)

    def _submit(
        self, request: GenerateRequest, stop: threading.Event, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Queue[Step | None], concurrent.futures.Future[InferenceResult]]:
        """Hand the job to the model thread; its steps, then ``None``, arrive on the returned queue."""
        events: asyncio.Queue[Step | None] = asyncio.Queue()

        def post(item: Step | None) -> None:  # called on the model thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        def on_step(step: int, total: int, preview: Image.Image | None) -> None:
            self.metrics.denoise_steps.inc()
            post(Step(step, total, preview))

        future = self.worker.submit(request.to_job(), stop, on_step)
        future.add_done_callback(lambda _f: post(None))
        return events, future

    def _mark_hung(self, future: concurrent.futures.Future[InferenceResult]) -> None:
        log.error("the model thread is stuck in a job past its time limit")
        self.model_hung = True

        def recovered(_f: object) -> None:
            self.model_hung = False
            log.warning("the stuck job has returned; the model thread is free again")

        future.add_done_callback(recovered)

    def _outcome(
        self, request: GenerateRequest, future: concurrent.futures.Future[InferenceResult]
    ) -> InferenceResult:
        try:
            return future.result()
        except Cancelled:
            if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE + " Your job was stopped.") from None
            raise
        except ServingError:
            raise
        except MemoryError:
            log.exception("request %s ran out of memory", request.request_id)
            raise OutOfMemory(request.request_id) from None
        except Exception:
            log.exception("request %s failed in the pipeline", request.request_id)
            raise GenerationFailed(request.request_id) from None

    def _encode(self, request: GenerateRequest, result: InferenceResult) -> list[Path]:
        p = self.profile
        return self._encode_pngs(
            result.images, self.output_dir, request.request_id, request.parameters(), p.name, p.scheduler
        )

    def _info(self, request: GenerateRequest, result: InferenceResult, t: dict[str, float]) -> dict[str, Any]:
        p = self.profile
        params = request.parameters()
        return {
            "request_id": request.request_id,
            "model": p.name,
            **params,
            "scheduler": sampler_name(p.scheduler),
            "batch_size": 1,
            "device": p.device,
            "dtype": p.dtype,
            "steps_done": result.steps_done,
            "peak_memory_bytes": result.peak_memory_bytes,
            "warnings": list(request.warnings),
            "timings": dict(t),
            "durations_ms": _durations(t),
            "reproduce": {
                "api_name": "/generate",
                "params": {**{k: v for k, v in params.items() if k != "seeds"}, "randomize_seed": False},
                "note": "The same parameters and seed give the same pixels on the same machine. "
                "Image i alone: seed = seeds[i], num_images = 1 (the same noise; batch "
                "arithmetic may differ by under 1/255 on average).",
            },
        }

    def _observe(self, info: dict[str, Any], images: int) -> None:
        d = info["durations_ms"]
        self.metrics.gate_wait.observe(d["gpu_wait"] / 1000)
        self.metrics.inference.observe(d["inference"] / 1000)
        self.metrics.finalize.observe(d["finalize"] / 1000)
        self.metrics.images.inc(images)
        log.info(
            "request %s done: %d image(s) %dx%d, %d steps, wait %.0f ms, infer %.0f ms, total %.0f ms",
            info["request_id"], images, info["width"], info["height"], info["num_inference_steps"],
            d["gpu_wait"], d["inference"], d["total"],
        )


async def _next(
    events: asyncio.Queue[Step | None], deadline: float | None, loop: asyncio.AbstractEventLoop
) -> Step | None:
    if deadline is None:
        return await events.get()
    return await asyncio.wait_for(events.get(), max(0.0, deadline - loop.time()))


async def _until_done(future: concurrent.futures.Future[Any], timeout: float | None = None) -> bool:
    """Wait for the model thread to finish ``future``, even if this task is cancelled again.

    Returns whether it finished (False only when ``timeout`` ran out).
    """
    waiter = asyncio.wrap_future(future)
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    while not waiter.done():
        try:
            remaining = None if end is None else max(0.0, end - loop.time())
            await asyncio.wait_for(asyncio.shield(waiter), remaining)
        except asyncio.TimeoutError:
            return False
        except asyncio.CancelledError:
            continue
        except BaseException:
            break
    if not waiter.cancelled():
        waiter.exception()  # mark it retrieved; the outcome was a cancel the caller asked for
    return True


def _durations(t: dict[str, float]) -> dict[str, float]:
    def ms(a: str, b: str) -> float:
        return round((t[b] - t[a]) * 1000, 3)

    return {
        "prepare": ms("prepare_start", "prepare_end"),
        "gpu_wait": ms("gpu_wait_start", "infer_start"),
        "inference": ms("infer_start", "infer_end"),
        "finalize": ms("finalize_start", "finalize_end"),
        "total": ms("received", "finalize_end"),
    }

"""The adapter between the I/O side (many concurrent requests) and the one model thread.

``LocalAdapter.run`` is an async generator that walks one request through four stages:

1. prepare   (concurrent) validate the raw values, resolve the seed, count prompt tokens
2. wait      in line for the GPU, reporting "k ahead" whenever k changes
3. infer     (serial) the head of the line takes the gate, an ``asyncio.Semaphore(1)``, and the
             compatible requests waiting behind it (dynamic batching); one job runs on the model
             thread and each request streams its own steps back
4. finalize  (concurrent) encode PNGs with their parameters, build the info record

Only stage 3 is inside the gate, and the gate belongs to the job: a ``gpu-job`` task releases it
when the model thread has returned, never earlier. Stages 1 and 4 run in the adapter's own small
thread pool, so the event loop never does more than bookkeeping. A request whose consumer stops
(cancel, disconnect, close) leaves at once; its job's ``threading.Event`` is set when nobody is
left in the job, and the model thread stops at the end of the step in progress.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
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
from .protocol import InferenceJob, InferenceResult, ModelProfile
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


class StopSignal(threading.Event):
    """A job's stop event that remembers how many steps had run when it was first set.

    The model thread writes ``steps`` after every step; ``set`` (from any thread) notes it, so a
    cancelled job can report how many steps it ran after being told to stop (at most 1 by design).
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.steps_at_set: int | None = None
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.steps_at_set is None:
            self.steps_at_set = self.steps
        super().set()
        for listener in list(self._listeners):
            listener()

    def on_set(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the setting thread) whenever this signal is set."""
        self._listeners.append(listener)


@dataclass(frozen=True)
class _End:
    """The last item on a member's queue: its share of the job's images, or the job's error."""

    result: InferenceResult | None = None
    error: BaseException | None = None
    batch_size: int = 1  # images in the job this request ran in
    batch_requests: int = 1  # requests in that job


@dataclass(eq=False)
class _Member:
    """A prepared request in line for the GPU, and then in a job."""

    request: GenerateRequest
    stop: StopSignal
    events: asyncio.Queue[Step | _End] = field(default_factory=asyncio.Queue)
    ticket: int = -1
    batch: _Batch | None = None  # set when a job takes this request
    end: _End | None = None  # set when this request's stream has ended

    def deliver(self, item: Step | _End) -> None:
        """Put a step or the end on this request's stream (on the event loop's thread)."""
        self.events.put_nowait(item)

    @property
    def key(self) -> tuple[int, int, int, float]:
        """Requests with equal keys can share a job: the same model, size, steps and guidance."""
        r = self.request
        return (r.width, r.height, r.num_inference_steps, r.guidance_scale)


class _Batch:
    """Requests that run as one job. Its stop is set when every member has stopped (or by force)."""

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        self.stop = StopSignal()
        for member in members:
            member.batch = self
            member.stop.on_set(self._member_stopped)
        self._member_stopped()

    def _member_stopped(self) -> None:
        if all(m.stop.is_set() for m in self.members):
            self.stop.set()

    @property
    def images(self) -> int:
        return sum(m.request.num_images for m in self.members)

    @property
    def offsets(self) -> list[int]:
        """Where each member's images start in the job (and, last, the job's image count)."""
        return list(itertools.accumulate((m.request.num_images for m in self.members), initial=0))

    def job(self) -> InferenceJob:
        jobs = [m.request.to_job() for m in self.members]
        offsets = self.offsets
        first = jobs[0]
        return InferenceJob(
            request_id=",".join(j.request_id for j in jobs),
            prompts=tuple(p for j in jobs for p in j.prompts),
            negative_prompts=tuple(p for j in jobs for p in j.negative_prompts),
            seeds=tuple(seed for j in jobs for seed in j.seeds),
            width=first.width,
            height=first.height,
            num_inference_steps=first.num_inference_steps,
            guidance_scale=first.guidance_scale,
            preview_every=max(j.preview_every for j in jobs),
            preview_images=tuple(offsets[i] for i, j in enumerate(jobs) if j.preview_every),
        )


@dataclass
class _Line:
    """Who waits for the gate, in arrival order, with a wake-up whenever the line or the gate moves."""

    tickets: dict[int, _Member] = field(default_factory=dict)
    counter: itertools.count = field(default_factory=itertools.count)
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def join(self, member: _Member) -> int:
        ticket = next(self.counter)
        self.tickets[ticket] = member
        member.ticket = ticket
        return ticket

    def leave(self, ticket: int) -> None:
        if self.tickets.pop(ticket, None) is not None:
            self.notify()

    def take_batch(self, head: _Member, max_images: int) -> _Batch:
        """``head`` and, in arrival order, the waiting requests compatible with it that still fit.

        The head is always first in line, so FIFO holds for it; a request passed over here moves
        up when this job starts and is never overtaken forever.
        """
        members, images = [head], head.request.num_images
        for ticket, member in list(self.tickets.items()):
            if member is head or member.stop.is_set() or member.key != head.key:
                continue
            if images + member.request.num_images <= max_images:
                members.append(member)
                images += member.request.num_images
                del self.tickets[ticket]
        self.tickets.pop(head.ticket, None)
        batch = _Batch(members)
        self.notify()
        return batch

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
        max_batch_size: int = 1,
    ) -> None:
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.limits = limits
        self.output_dir = output_dir
        self._clock = clock
        self._encode_pngs = encode
        self.job_timeout = job_timeout
        self.model_hung = False  # a job ran past its limit and its thread has not returned yet
        self._on_close: list[Callable[[], None]] = []
        self._gate = asyncio.Semaphore(1)
        self._line = _Line()
        self._jobs: set[asyncio.Task[None]] = set()  # the job holding the gate (at most one)
        self._running: dict[int, StopSignal] = {}  # id(batch) -> the stop of the job on the model thread
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

    def shutdown_model(self, timeout: float | None = None) -> None:
        """End the model thread (after its current job, whose stop ``begin_shutdown`` has set)."""
        self.worker.shutdown(timeout=timeout)

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
        async with contextlib.aclosing(accounted(self, self._stages(raw, request_id, alive))) as events:
            async for event in events:
                yield event

    async def _stages(
        self, raw: Mapping[str, Any], request_id: str | None, alive: Callable[[], bool] | None
    ) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        t: dict[str, float] = {"received": self._clock()}
        if self.closing:
            raise ShuttingDown(SHUTDOWN_MESSAGE)
        stop = StopSignal()  # set: the model thread stops this job at its next step
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
        stop: StopSignal,
    ) -> AsyncIterator[Event]:
        # 1. Prepare: concurrent, off the loop. A bad field fails here, before any GPU work.
        t["prepare_start"] = self._clock()
        request = await loop.run_in_executor(self._pool, self._prepare, raw, request_id)
        t["prepare_end"] = self._clock()

        # 2. Wait in line for the GPU, telling the caller how many are ahead as that changes. The
        #    head of the line may take this request along into its job (dynamic batching).
        t["gpu_wait_start"] = self._clock()
        member = _Member(request, stop)
        self._line.join(member)
        try:
            reported = -1
            while member.batch is None:
                moved = self._line.moved  # taken before the check, so no wake-up is missed
                ahead = self._line.before(member.ticket) + int(self._gate.locked())
                if not ahead or self.closing or stop.is_set():
                    break
                if ahead != reported:
                    reported = ahead
                    yield Waiting(ahead)
                await moved.wait()
            if member.batch is None:
                if self.closing:
                    raise ShuttingDown(SHUTDOWN_MESSAGE)
                if stop.is_set():
                    raise Cancelled("the caller went away while waiting")
            if reported != 0:
                yield Waiting(0)
            if member.batch is None:
                # 3. Head of the line and the gate is free: take it now (a free semaphore never
                #    suspends, so nobody can overtake) and give it to this job's runner task, which
                #    releases it only when the model thread has returned. The gate belongs to the
                #    job, not to any one request: each request, this one included, may leave.
                await self._gate.acquire()
                try:
                    batch = self._line.take_batch(member, self.max_batch_size)
                    job = asyncio.create_task(self._run_job(batch, loop), name="gpu-job")
                    self._jobs.add(job)  # a reference, so the task is not garbage-collected
                    job.add_done_callback(self._jobs.discard)
                except BaseException:
                    self._gate.release()
                    raise
            # Stream this request's steps from the job (its own, or the head's that took it along).
            try:
                async for event in _relay(member):
                    yield event
            except BaseException:
                stop.set()  # this request leaves; its job stops if nobody else is left in it
                raise
        finally:
            self._line.leave(member.ticket)
            self._line.notify()  # the gate may have opened: wake the line
        end = member.end
        assert end is not None
        result = self._outcome(request, end)
        t["infer_start"], t["infer_end"] = result.started, result.ended

        # 4. Finalize: concurrent, off the loop.
        t["finalize_start"] = self._clock()
        paths = await loop.run_in_executor(self._pool, self._encode, request, result)
        t["finalize_end"] = self._clock()
        info = self._info(request, result, t, end)
        self._observe(info, len(paths))
        yield Done(paths, info)

    # -- the job on the model thread -----------------------------------------------------------
    async def _run_job(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        """The task that owns the gate for one job; the gate opens when the model thread is done."""
        try:
            await self._execute(batch, loop)
        finally:
            self._gate.release()
            self._line.notify()  # the gate opened: wake the line

    async def _execute(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``batch`` on the model thread and end every member's stream. Never raises.

        An out-of-memory error in a job of several requests is retried once, one request at a time,
        before anyone gets an error.
        """
        error = await self._attempt(batch, loop)
        if isinstance(error, (OutOfMemory, MemoryError)) and len(batch.members) > 1:
            log.warning("out of memory in a job of %d requests (%d images); retrying one request at a time",
                        len(batch.members), batch.images)
            self.metrics.oom_retries.inc()
            for member in batch.members:
                if member.stop.is_set():
                    member.deliver(_End(error=Cancelled("cancelled before the retry")))
                elif (alone := await self._attempt(_Batch([member]), loop)) is not None:
                    member.deliver(_End(error=alone))
        elif error is not None:
            for member in batch.members:
                member.deliver(_End(error=error))

    async def _attempt(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> BaseException | None:
        """One job on the model thread. On success every member gets its images; else returns the error."""
        job = batch.job()
        members = batch.members
        stop = batch.stop
        offsets = batch.offsets

        def deliver(steps: list[Step]) -> None:  # event loop
            for member, step in zip(members, steps):
                member.deliver(step)

        def on_step(step: int, total: int, previews: Mapping[int, Image.Image]) -> None:  # model thread
            stop.steps = step
            self.metrics.denoise_steps.inc()
            steps = [Step(step, total, previews.get(offsets[i])) for i in range(len(members))]
            try:
                loop.call_soon_threadsafe(deliver, steps)  # one wake-up of the loop per step, not one per request
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        self._running[id(batch)] = stop
        self.metrics.batch_images.observe(job.num_images)
        if self.closing:
            stop.set()
        future = self.worker.submit(job, stop, on_step)
        # Steps are posted with call_soon_threadsafe before the future's own callback, so every
        # step is delivered before the end.
        try:
            if not await _until_done(future, timeout=self.job_timeout):
                # Past the limit: stop at the next step. A thread stuck inside one step cannot be
                # interrupted; the callers are answered anyway, and the single model thread still
                # keeps the next job from running beside the stuck one.
                stop.set()
                if not await _until_done(future, timeout=TIMEOUT_GRACE_SECONDS):
                    self._mark_hung(future)
                return _TimedOut()
        finally:
            self._running.pop(id(batch), None)
        error = future.exception()
        if error is None:
            result = future.result()
            for i, member in enumerate(members):
                share = dataclasses.replace(result, images=result.images[offsets[i]:offsets[i + 1]])
                member.deliver(_End(result=share, batch_size=job.num_images, batch_requests=len(members)))
            return None
        if isinstance(error, Cancelled) and stop.steps_at_set is not None:
            self.metrics.steps_after_stop.observe(error.steps_done - stop.steps_at_set)
        if not isinstance(error, (ServingError, MemoryError)):
            log.error("job %s failed in the pipeline", job.request_id, exc_info=error)
        return error

    # -- stages ------------------------------------------------------------------------------
    def _prepare(self, raw: Mapping[str, Any], request_id: str | None) -> GenerateRequest:
        return validate(raw, self.limits, self.worker.model.count_tokens, request_id=request_id)

    def _mark_hung(self, future: concurrent.futures.Future[InferenceResult]) -> None:
        log.error("the model thread is stuck in a job past its time limit")
        self.model_hung = True

        def recovered(_f: object) -> None:
            self.model_hung = False
            log.warning("the stuck job has returned; the model thread is free again")

        future.add_done_callback(recovered)

    def _outcome(self, request: GenerateRequest, end: _End) -> InferenceResult:
        """This request's images, or its job's error in this request's words."""
        error = end.error
        if error is None:
            assert end.result is not None
            return end.result
        if isinstance(error, Cancelled):
            if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE + " Your job was stopped.") from None
            raise error
        if isinstance(error, _TimedOut):
            assert self.job_timeout is not None
            raise JobTimedOut(request.request_id, self.job_timeout) from None
        if isinstance(error, (OutOfMemory, MemoryError)):
            raise OutOfMemory(request.request_id) from None
        if isinstance(error, ServingError):
            raise error
        raise GenerationFailed(request.request_id) from None

    def _encode(self, request: GenerateRequest, result: InferenceResult) -> list[Path]:
        p = self.profile
        return self._encode_pngs(
            result.images, self.output_dir, request.request_id, request.parameters(), p.name, p.scheduler
        )

    def _info(
        self, request: GenerateRequest, result: InferenceResult, t: dict[str, float], end: _End
    ) -> dict[str, Any]:
        p = self.profile
        params = request.parameters()
        return {
            "request_id": request.request_id,
            "model": p.name,
            **params,
            "scheduler": sampler_name(p.scheduler),
            "batch_size": end.batch_size,
            "batch_requests": end.batch_requests,
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


async def accounted(adapter: Any, stages: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """Stream one request's events, counting it on ``adapter``: in flight, its outcome, failures in a row.

    Shared by ``LocalAdapter`` and ``RayAdapter`` (``in_flight``, ``metrics``, ``consecutive_failures``).
    """
    adapter.in_flight += 1
    adapter.metrics.in_flight.inc()
    outcome = "failed"
    try:
        async with contextlib.aclosing(stages):
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
        adapter.in_flight -= 1
        adapter.metrics.in_flight.dec()
        adapter.metrics.jobs.labels(outcome).inc()
        if outcome == "failed":
            adapter.consecutive_failures += 1
        elif outcome == "completed":
            adapter.consecutive_failures = 0


class _TimedOut(Exception):
    """A job ran past the adapter's time limit (each request gets its own ``JobTimedOut``)."""


async def _relay(member: _Member) -> AsyncIterator[Step]:
    """This request's steps as its job runs; its end is left on ``member.end``."""
    while True:
        item = await member.events.get()
        if isinstance(item, _End):
            member.end = item
            return
        yield item




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

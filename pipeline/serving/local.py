"""The adapter between many concurrent requests and the one model side in this process.

``LocalAdapter.run`` walks one request through four numbered steps (``_request``):

1. prepare   validate the raw values but the pictures' bytes and resolve the seed (on the loop:
             microseconds); the quota and the waiting cap answer; then decode the pictures (on the
             decode threads, ``decoding.Decoder``) and count the tokens of a prompt that might not
             fit its text encoders (concurrent, in the pool)
2. wait      in line for the GPU, reporting "k ahead" whenever k changes, with the estimated
             time until its images (``eta.py``)
3. infer     (serial) the scheduler (``scheduler.Scheduler``) takes it into a batch: one that opens
             with the gate, an ``asyncio.Semaphore(1)``, or the running step-level loop at a step
             boundary; its job runs on the model side and it streams its own steps back
4. finalize  (concurrent) encode PNGs with their parameters, build the info record

Only step 3 is inside the gate, and the gate belongs to the batch: the ``gpu-batch`` task that holds
it releases it when the model side has left every job of the batch, never earlier. Step 4 (and step 1 when it
counts) runs in the adapter's small thread pool, so the event loop only keeps the books. A
request whose consumer stops (cancel, disconnect, close) leaves at once; its job's stop is set
when nobody is left in the job, and the model stops at the end of the step in progress.

State and owners: the event loop owns the gate, the scheduler (its one ``scheduler`` task acts on
its decisions), the jobs' ``running`` stops and every request's stream; the model-stream thread
only posts to the loop; ``begin_shutdown`` from another thread goes through the loop
(``AdapterBase.on_loop``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Iterator, Mapping

from ..errors import (
    Cancelled,
    DeviceFailed,
    EngineDead,
    GenerationFailed,
    JobTimedOut,
    ModelProcessDied,
    OutOfMemory,
    ShuttingDown,
    TooManyWaiting,
)
from ..fields import STEP_CACHE_AUTO, STEP_CACHE_OFF
from ..protocol import InferenceResult, ModelProfile, ModelSide, Output, StopSignal, Timings
from ..request import (
    GenerateRequest,
    Limits,
    has_pictures,
    needs_token_count,
    new_request_id,
    validate,
    with_pictures,
    with_token_notes,
)
from .base import SHUTDOWN_MESSAGE, AdapterBase
from .eta import Shape
from .jobs import AUTO_LIMIT_FLOOR_SECONDS, GpuJobs
from .metrics import Metrics
from .postprocess import encode_pngs, info_record, lora_fields, sampler_used
from .scheduler import REPORT_INTERVAL, Batch, Entry, Scheduler, WaitLine, looping
from .streamer import ModelStreamer

log = logging.getLogger(__name__)


class LocalAdapter(AdapterBase):
    """Runs requests against one ``ModelSide``; the gate wraps only the inference."""

    def __init__(
        self,
        side: ModelSide,
        limits: Limits,
        output_dir: Path,
        *,
        pool_threads: int | None = None,
        clock: Callable[[], float] = time.time,
        encode: Callable[..., list[Path]] = encode_pngs,
        job_timeout: float | None = None,
        auto_limit_floor: float = AUTO_LIMIT_FLOOR_SECONDS,
        max_batch_size: int = 1,
        max_waiting_per_user: int | None = None,
        step_joining: bool = False,
        report_interval: float = REPORT_INTERVAL,
    ) -> None:
        self._line: WaitLine[Entry] = WaitLine(report_interval)
        self._gate = self.make_gate()
        super().__init__(
            Metrics(lambda: self.gpu_queue_depth, lambda: int(self.inference_in_progress)), pool_threads=pool_threads
        )
        self.side = side
        self.streamer = ModelStreamer(side)
        self.limits = limits
        self.output_dir = output_dir
        self.max_batch_size = max_batch_size
        self.max_waiting_per_user = max_waiting_per_user  # None: no cap
        self.job_timeout = job_timeout
        self._clock = clock
        self._encode_pngs = encode
        # Step-level batching where the model and its side can (engine.loop.joining): requests join
        # the running loop at a step boundary instead of waiting for the gate.
        self.step_joining = step_joining and side.profile.step_joining and self.streamer.many_in_flight
        if not self.step_joining and limits.step_caches:  # step caches run in loops (issue 50): none here
            if limits.step_cache not in (STEP_CACHE_OFF, STEP_CACHE_AUTO):
                raise SystemExit(f"--step-cache {limits.step_cache} needs step-level loops, off on this server")
            self.limits = replace(limits, step_caches=())
        self.scheduler = Scheduler(
            max_batch_size,
            joining=self.step_joining,
            mixed_loras=getattr(side.profile, "lora_batching", "") == "mixed",
            line=self._line,
            loop_modes=getattr(side.profile, "loop_modes", ("text",)),
            models={p.model_id: looping(p, step_joining and self.streamer.many_in_flight)
                    for p in getattr(side.profile, "models", ())},  # several models (issue 52)
        )  # fmt: skip
        self.metrics.set_models(getattr(side.profile, "residency", ()))
        self.jobs = GpuJobs(
            self.streamer,
            self.metrics,
            job_timeout=job_timeout,
            closing=lambda: self.closing,
            auto_floor=auto_limit_floor,
            reports=self.scheduler,
            memory=self.scheduler.memory,
            abort=self.abort,
        )
        self._job_tasks: set[asyncio.Task[None]] = set()  # the batch holding the gate (at most one)
        self._scheduling: asyncio.Task[None] | None = None  # the scheduler's owner task, started lazily
        self._preparing_now: collections.Counter[str] = collections.Counter()  # user -> requests preparing (loop)

    @staticmethod
    def make_gate() -> asyncio.Semaphore:
        """The GPU's capacity: one inference at a time."""
        return asyncio.Semaphore(1)

    @property
    def profile(self) -> ModelProfile:  # type: ignore[override]
        return self.side.profile

    @property
    def gpu_queue_depth(self) -> int:
        """Prepared requests waiting for the gate."""
        return len(self._line.tickets)

    @property
    def inference_in_progress(self) -> bool:
        return self._gate.locked()

    @property
    def model_hung(self) -> bool:
        return self.jobs.model_hung

    @property
    def model_side_state(self) -> str:
        """ready, recovering (a model process is restarting), dead or closed; always ready in-thread."""
        return str(getattr(self.side, "state", "ready" if self.side.alive else "dead"))

    def _health_fields(self) -> tuple[bool, bool, dict[str, Any]]:
        own = {
            "model_hung": self.model_hung,
            "model_side": self.model_side_state,
            "model_restarts": int(getattr(self.side, "restarts", 0)),
            "previews": "on" if self.profile.previews else f"off: {self.profile.preview_note}",
        }
        return not self.streamer.alive, self.model_hung, own

    def _recovering(self) -> bool:
        return self.model_side_state == "recovering"

    def _stopped(self, stop: StopSignal) -> Callable[[], None]:
        """How ``abort`` stops a request here: its stop is set (read at every step), the line looks again."""

        def set_stop() -> None:
            stop.set()
            self._line.notify()

        return set_stop

    @contextlib.contextmanager
    def _preparing(self, user: str | None) -> Iterator[None]:
        """A request of ``user``'s while it prepares, counted with its waiting ones: a user already at
        the cap of waiting requests (``max_waiting_per_user``) is answered at once, ``TooManyWaiting``."""
        cap = self.max_waiting_per_user
        if user is None or cap is None:
            yield
            return
        waiting = self.scheduler.waiting(user, gate_free=not self._gate.locked()) + self._preparing_now[user]
        if waiting >= cap:
            raise TooManyWaiting(waiting)
        self._preparing_now[user] += 1
        try:
            yield
        finally:
            self._preparing_now[user] -= 1
            if not self._preparing_now[user]:
                del self._preparing_now[user]

    def shutdown_model(self, timeout: float | None = None) -> None:
        """End the model side (after its current job, whose stop ``begin_shutdown`` has set)."""
        self.streamer.shutdown(timeout=timeout)

    # -- the request -------------------------------------------------------------------------
    async def run(
        self,
        raw: Mapping[str, Any],
        *,
        request_id: str | None = None,
        alive: Callable[[], bool] | None = None,
        user: str | None = None,
        account: str | None = None,
    ) -> AsyncGenerator[Output, None]:
        """One request, in four numbered steps (the module docstring); see ``Adapter.run``.

        One async generator from the mailbox to the caller: a step crosses no other.
        """
        with self.accounted() as outcome, contextlib.ExitStack() as cleanup:
            event_loop = asyncio.get_running_loop()
            t = Timings(received=self._clock())
            rid = request_id or new_request_id()
            stop = StopSignal()  # set: this request leaves; its job stops when nobody is left in it
            cleanup.enter_context(self.abortable(rid, self._stopped(stop)))  # ``abort(rid)`` from now on

            with self.liveness.watching(alive, lambda: self.abort(rid, "gone")):
                # 1. Prepare, gates before work. Every field but the pictures' bytes is checked on the
                #    loop (microseconds); then the quota, then the waiting cap answer; only then are
                #    the pictures decoded (``request.with_pictures``: up to a second of CPU at the caps),
                #    on the decode threads, one request at a time per identity (``decoding``). Counting a
                #    prompt's tokens (only one that might not fit its text encoders' windows:
                #    ``fields.fits_every_window``) may ask the model process, so it runs off the loop too.
                t.prepare_start = self._clock()
                request = validate(raw, self.limits, request_id=rid, pictures_later=True)
                held = cleanup.enter_context(self.quota_held(account or user, request.num_images))
                with self._preparing(user):  # the waiting cap answers here, before any picture is decoded
                    if has_pictures(raw):
                        request = await self.decoder.run(user, with_pictures, request, raw, self.limits_of(request))
                    if needs_token_count(request, self.limits_of(request)):
                        request = await event_loop.run_in_executor(self._pool, self._count_tokens, request)
                if stop.is_set():  # stopped while it was prepared: it never enters the line
                    raise ShuttingDown(SHUTDOWN_MESSAGE) if self.closing else Cancelled("stopped while prepared")
                t.prepare_end = t.gpu_wait_start = self._clock()

                # 2. Wait in line for the GPU, in a fair order across users (round-robin, ``WaitLine.order``).
                #    The scheduler takes it into a batch.
                entry = Entry(request, stop, contextvars.copy_context(), user=user)
                self._start_scheduling()
                self.scheduler.add(entry)
                end: InferenceResult | None = None
                try:
                    async for waiting in self._wait_turn(entry):
                        yield waiting
                    # 3. Infer: this request's steps from its job, straight from its mailbox, then its end.
                    try:
                        while isinstance(item := await entry.events.get(), Output):
                            if item.step:  # a step has run: the quota is spent, whatever happens next
                                held.ran()
                            yield item
                        end = item
                    except BaseException:
                        self.abort(rid, "closed")  # this request leaves; its job stops if nobody else is left in it
                        raise
                finally:
                    self.scheduler.leave(entry)
            assert end is not None
            result = self._outcome(request, end)
            t.infer_start, t.infer_end = result.started, result.ended

            # 4. Finalize: concurrent, off the loop.
            t.finalize_start = self._clock()
            paths, first_pass = await event_loop.run_in_executor(self._pool, self._encode, request, result, user)
            t.finalize_end = self._clock()
            info = info_record(request, result, t, self.profile.of(request.model))
            self._observe(info, len(paths))
            held.keep()
            outcome.delivered = True
            yield Output(request.request_id, finish="done", paths=tuple(paths), info=info, first_pass=tuple(first_pass))

    async def _wait_turn(self, entry: Entry) -> AsyncGenerator[Output, None]:
        """Report "k ahead" until the scheduler takes ``entry`` into a batch (or it stops, or we close)."""
        async for waiting in self._line.turn(
            entry.ticket,
            busy=lambda: int(self._gate.locked()),
            done=lambda ahead: entry.taken or not ahead or self.closing or entry.stop.is_set(),
        ):
            yield Output(entry.request.request_id, ahead=waiting.ahead, eta_seconds=self._eta(entry),
                         info=self._switch_note(entry))  # fmt: skip
        while not (entry.taken or self.closing or entry.stop.is_set()):
            await self._line.moved.wait()  # the head with nothing running: the scheduler takes it next
        if not entry.taken:
            if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE)
            raise Cancelled("the caller went away while waiting")
        yield Output(entry.request.request_id, ahead=0, eta_seconds=self._eta(entry))

    def _switch_note(self, entry: Entry) -> dict[str, Any]:
        """Several models: ``{"model_switch": NAME}`` where the request's model is not the one the GPU runs
        now or ran last (its wait, and its ETA, include the switch); {} otherwise."""
        if not self.limits.models:
            return {}
        loaded, model = self._loaded_model(), entry.request.model
        return {"model_switch": model} if loaded and model and model != loaded else {}

    def _loaded_model(self) -> str:
        """The model the GPU runs now (the running batch's), else the one it ran last ("": none yet)."""
        running = self.scheduler.running
        return running.entries[0].request.model if running is not None and running.entries else self.metrics.last_model

    # -- the scheduler's owner: one task on the loop acts on its decisions -------------------------
    def _start_scheduling(self) -> None:
        if self._scheduling is None or self._scheduling.done():
            self._scheduling = asyncio.get_running_loop().create_task(self._schedule(), name="scheduler")

    async def _schedule(self) -> None:
        """Whenever the line or the running batch moves: ask the scheduler what runs now, and do it."""
        while True:
            moved = self._line.moved  # taken before deciding, so no wake-up is missed
            try:
                opened, joins = self.scheduler.schedule(closing=self.closing, gate_free=not self._gate.locked())
                if opened is not None:
                    # The gate is free (the scheduler opens a batch only then), so taking it never
                    # suspends. The batch's task holds it until the model side has
                    # left the batch: the gate belongs to the batch, not to any request.
                    await self._gate.acquire()
                    task = asyncio.create_task(self._own_gate(opened), name="gpu-batch")
                    self._job_tasks.add(task)  # a reference, so the task is not garbage-collected
                    task.add_done_callback(self._job_tasks.discard)
                if joins:
                    assert self.scheduler.running is not None
                    self.jobs.start(self.scheduler.running, joins)
            except Exception:  # a bug here would strand every request: say so, and keep serving
                log.critical("the scheduler failed", exc_info=True)
            await moved.wait()

    async def _own_gate(self, batch: Batch) -> None:
        """The task that holds the gate for one batch; the gate opens when the model side is done with it."""
        try:
            await self.jobs.run(batch)
        finally:
            self._gate.release()
            self.scheduler.ended(batch)  # wakes the line

    def _eta(self, entry: Entry) -> float | None:
        """Seconds until ``entry``'s images: the running job's time left, then each batch the
        scheduler would form before and with it (``Scheduler.plan_until``), from measured rates (``eta.py``)."""
        book, clock, now = self.jobs.book, self.jobs.clock, time.monotonic()
        if entry.taken:  # taken into the running batch
            entries = entry.batch.entries if entry.batch is not None and not entry.batch.joinable else [entry]
            left = clock.remaining(book, now) if clock is not None else book.job_seconds(_shape(entries))
            return None if left is None else round(left, 2)
        total = 0.0
        if self._gate.locked() and clock is not None:
            left = clock.remaining(book, now)
            if left is None:
                return None
            total += left
        model = self._loaded_model()
        for batch in self.scheduler.plan_until(entry):
            seconds = book.job_seconds(_shape(batch))
            if seconds is None:
                return None
            if batch[0].request.model != model and model:  # several models: the measured switch (issue 52)
                total += self.metrics.last_switch_seconds
            model = batch[0].request.model
            total += seconds
        return round(total, 2)

    # -- stages ------------------------------------------------------------------------------
    def _count_tokens(self, request: GenerateRequest) -> GenerateRequest:
        limits = self.limits_of(request)
        if not limits.models and limits is self.limits:  # one model: the side's own count
            return with_token_notes(request, limits, self.side.count_tokens)
        return with_token_notes(request, limits, partial(self.side.count_tokens, model=request.model))

    def limits_of(self, request: GenerateRequest) -> Limits:
        """The limits of the request's model (several models, issue 52; else the server's)."""
        return self.limits.pick(request.model or None)

    def _outcome(self, request: GenerateRequest, end: InferenceResult) -> InferenceResult:
        """This request's images, or why it ended in this request's words: the one translation of an
        ending (``protocol.FinishReason``) into a ``ServingError``; the handler only shows it."""
        rid = request.request_id
        match end.reason:
            case "done":
                return end
            case "cancelled" if self.closing:
                raise ShuttingDown(SHUTDOWN_MESSAGE + " Your job was stopped.")
            case "cancelled":
                raise Cancelled(end.message or "cancelled", steps_done=end.steps_done)
            case "shutting_down":
                raise ShuttingDown(SHUTDOWN_MESSAGE)
            case "timed_out":
                raise JobTimedOut(rid, end.limit)
            case "out_of_memory":
                raise OutOfMemory(rid)
            case "device_lost":
                log.error("request %s: the device failed: %s", rid, end.message)
                raise DeviceFailed(rid)
            case "crashed":
                raise ModelProcessDied(rid)
            case "engine_dead":
                raise EngineDead(end.message)
            case _:  # failed: the model side's detail is in the log (jobs.GpuJobs._on_model)
                raise GenerationFailed(rid)

    def _encode(
        self, request: GenerateRequest, result: InferenceResult, user: str | None
    ) -> tuple[list[Path], list[Path]]:
        """The PNGs of its images, and of a hires fix's first pass (named ``<id>-first-<i>.png``, with
        the parameters that draw it again: the same request without the hires fix)."""
        p, rid = self.profile.of(request.model), request.request_id
        params, sampler = {**request.parameters(), **lora_fields(request, p)}, sampler_used(request, p)
        paths = self._encode_pngs(result.images, self.output_dir, rid, params, p.name, sampler, user)
        if not result.first_pass:
            return paths, []
        first = {key: value for key, value in params.items() if not key.startswith("hires_")}
        out = self.output_dir
        return paths, self._encode_pngs(result.first_pass, out, f"{rid}-first", first, p.name, sampler, user)

    def _observe(self, info: dict[str, Any], images: int) -> None:
        d = info["durations_ms"]
        self.metrics.gate_wait.observe(d["gpu_wait"] / 1000)
        self.metrics.inference.observe(d["inference"] / 1000)
        self.metrics.finalize.observe(d["finalize"] / 1000)
        self.metrics.images.inc(images)
        log.info(
            "request %s done: %d image(s) %dx%d, %d steps, wait %.0f ms, infer %.0f ms, total %.0f ms",
            info["request_id"],
            images,
            info["width"],
            info["height"],
            info["num_inference_steps"],
            d["gpu_wait"],
            d["inference"],
            d["total"],
        )


def _shape(entries: list[Entry]) -> Shape:
    """The shape of a job of these requests (they share size, steps, mode and strength)."""
    job = entries[0].request.to_job()
    return Shape(job.width * job.height, job.steps_run, sum(e.request.num_images for e in entries))

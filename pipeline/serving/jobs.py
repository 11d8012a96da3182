"""Runs the scheduler's batches on the model side, for the task that owns the gate: steps out, one end per entry.

``GpuJobs.run(batch)`` holds the batch until its last entry has left; ``GpuJobs.start(batch, joins)``
sends entries into it. One path for both kinds of batch (``scheduler.Batch``): an entry of a
joinable batch is its own job on the model side, entering the step-level loop at a step boundary
and leaving when its own steps are done, with its own steps, stop, time limit and end; a closed
batch is one whole-pipeline call whose steps go to every entry and whose images are shared out.
Either way, each part is ``_part``: the job on the model side under its time limit, then every
entry's end; an out-of-memory error in a part that shared calls with others is retried once, each
entry alone, before anyone gets an error.

``run`` returns only when the model side has left every part (or, past the time limit, has been
given up on), so the gate it runs under is never released while a job is still denoising.

Owners: the event loop owns ``running`` and ``model_hung``; the model-stream thread's callbacks
reach the loop through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import logging
import time
from typing import Any, Callable, Protocol

from ..protocol import InferenceJob, InferenceResult, ModelEvent, Output, StepEvent, StopSignal
from .eta import EtaBook, JobClock, Shape
from .metrics import Metrics
from .scheduler import Batch, Entry, Join, MemoryRoom, call_job, image_offsets
from .streamer import ModelStreamer

log = logging.getLogger(__name__)

TIMEOUT_GRACE_SECONDS = 2.0  # after a time limit, how long to wait for the model side to stop
# The default time limit (no --job-timeout), from the measured rate: twice the job's expected time
# (as if its loop were full) plus a floor, and before anything has been measured a fixed limit.
AUTO_LIMIT_FLOOR_SECONDS = 30.0
AUTO_LIMIT_FACTOR = 2.0
AUTO_LIMIT_UNMEASURED_SECONDS = 600.0


class Reports(Protocol):
    """What the job runner tells the scheduler (``Scheduler``): the only changes to its entries and batches."""

    def last_step(self, entry: Entry) -> None: ...

    def left(self, batch: Batch, entries: list[Entry]) -> None: ...


class GpuJobs:
    """Runs batches on the model side; the caller holds the gate around ``run``."""

    def __init__(
        self,
        streamer: ModelStreamer,
        metrics: Metrics,
        *,
        job_timeout: float | None,
        closing: Callable[[], bool],
        auto_floor: float = AUTO_LIMIT_FLOOR_SECONDS,
        reports: Reports,
        memory: MemoryRoom | None = None,
        abort: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.streamer = streamer
        self.metrics = metrics
        self.job_timeout = job_timeout  # None: each job's limit follows the measured rate (time_limit)
        self.auto_floor = auto_floor
        self._closing = closing
        self._reports = reports  # steps and endings, to the scheduler: it alone changes entries
        self._abort = abort  # the adapter's one stop verb (a time limit stops a job's requests through it)
        self.memory = memory if memory is not None else MemoryRoom()
        self.model_hung = False  # a job ran past its limit and the model side has not returned yet
        self.book = EtaBook()  # measured rates per shape, for the ETA (eta.py)
        self.clock: JobClock | None = None  # the job on the model side now, as the ETA follows it
        self._parts: dict[Batch, set[asyncio.Task[None]]] = {}

    def time_limit(self, job: InferenceJob, images: int = 0) -> float:
        """Seconds ``job`` may run: ``--job-timeout``, else from the measured rate (see the constants).

        A joinable job is timed as if its loop held the most images it may (``images``: each step
        then draws them all), so a full loop does not time out its members.
        """
        if self.job_timeout is not None:
            return self.job_timeout
        images = max(job.num_images, images)
        expected = self.book.job_seconds(Shape(job.width * job.height, job.steps_run, images))
        if expected is None:
            return AUTO_LIMIT_UNMEASURED_SECONDS
        return round(self.auto_floor + AUTO_LIMIT_FACTOR * expected, 1)

    # -- a batch -----------------------------------------------------------------------------
    async def run(self, batch: Batch) -> None:
        """Start ``batch``'s entries and hold it until the last has left and its parts are done. Never raises."""
        parts = self._parts.setdefault(batch, set())
        if batch.joinable:
            self.start(batch, [Join(entry) for entry in batch.entries])
        else:
            self._start_part(batch, list(batch.entries), ())
        while parts:
            await asyncio.gather(*list(parts), return_exceptions=True)
        del self._parts[batch]

    def start(self, batch: Batch, joins: list[Join]) -> None:
        """Send these entries into the running (joinable) batch: each is its own job on the model side."""
        for join in joins:
            self._start_part(batch, [join.entry], join.enters_after)

    def _start_part(self, batch: Batch, entries: list[Entry], enters_after: tuple[str, ...]) -> None:
        task = asyncio.create_task(self._part(batch, entries, enters_after), name="gpu-part")
        parts = self._parts.setdefault(batch, set())
        parts.add(task)
        task.add_done_callback(parts.discard)

    async def _part(self, batch: Batch, entries: list[Entry], enters_after: tuple[str, ...]) -> None:
        """One job on the model side and every entry's end; then they leave the batch. Never raises."""
        try:
            error = await self._attempt(batch, entries, enters_after, joinable=batch.joinable)
            if self.retry_alone(error, entries):
                log.warning(
                    "out of memory in a batch of %d requests; retrying %s alone",
                    max(e.peers for e in entries),
                    ", ".join(e.request.request_id for e in entries),
                )
                self.metrics.oom_retries.inc()
                for entry in entries:
                    if entry.stop.is_set():
                        entry.deliver(InferenceResult.ended_by("cancelled", "cancelled before the retry"))
                    elif (alone := await self._attempt(batch, [entry], (), joinable=False)) is not None:
                        entry.deliver(alone)
            elif error is not None:
                for entry in entries:
                    entry.deliver(error)
        finally:
            self._reports.left(batch, entries)  # room in the batch: the scheduler may take joiners, or end it

    @staticmethod
    def retry_alone(error: InferenceResult | None, entries: list[Entry]) -> bool:
        """An out-of-memory error in a job that shared the device with others (in its call or its loop)."""
        shared = len(entries) > 1 or any(e.peers > 1 for e in entries)
        out_of_memory = error is not None and error.reason == "out_of_memory"
        return out_of_memory and shared and not all(e.stop.is_set() for e in entries)

    async def _attempt(
        self, batch: Batch, entries: list[Entry], enters_after: tuple[str, ...], *, joinable: bool
    ) -> InferenceResult | None:
        """One job on the model side. On success every entry gets its images; else returns its failure."""
        if len(entries) == 1:
            entry = entries[0]
            job, stop = entry.request.to_job(), entry.stop
            if joinable:
                job = dataclasses.replace(job, joinable=True, loop_id=batch.loop_id, enters_after=enters_after)
        else:
            job, stop = call_job(entries), _all_stopped(entries)
        offsets = image_offsets(entries)
        outcome = await self._on_model(
            job,
            stop,
            entries[0].context,  # the head's user
            lambda event, clock: self._deliver_step(entries, offsets, event, clock, joinable),
            self.time_limit(job, batch.max_images if joinable else 0),
            lambda: self._past_limit(entries, stop),
        )
        if not outcome.ok:
            return outcome
        images = outcome.batch_images or job.num_images
        self.metrics.batch_images.observe(images)
        self.memory.learn(job.width, job.height, images, outcome, control=bool(job.controls))
        if outcome.model_switch_ms:  # several models (issue 52): the moves it waited for, where each model is
            self.metrics.last_switch_seconds = outcome.model_switch_ms / 1000
            self.metrics.model_switch.observe(self.metrics.last_switch_seconds)
        if outcome.residency:
            self.metrics.set_models(outcome.residency)
        self.metrics.last_model = outcome.model or self.metrics.last_model
        for i, entry in enumerate(entries):
            share = slice(offsets[i], offsets[i + 1])
            entry.deliver(
                dataclasses.replace(
                    outcome,
                    images=outcome.images[share],
                    first_pass=outcome.first_pass[share],
                    batch_images=images,
                    batch_jobs=outcome.batch_jobs or len(entries),
                )
            )
        return None

    def _past_limit(self, entries: list[Entry], stop: StopSignal) -> None:
        """A job past its time limit: its requests are stopped through ``abort`` (a closed call's
        stop follows when all of them have stopped); without an adapter, the job's own stop."""
        if self._abort is None:
            stop.set()
            return
        for entry in entries:
            self._abort(entry.request.request_id, "time_limit")

    async def _on_model(
        self,
        job: InferenceJob,
        stop: StopSignal,
        context: contextvars.Context | None,
        on_step: Callable[[StepEvent, JobClock], None],
        limit: float,
        past_limit: Callable[[], None],
    ) -> InferenceResult:
        """Run ``job`` on the model side under the time limit; ``on_step`` gets each step on the event
        loop. Returns its result or its error only when the model side has left it (or, past the
        limit, has been given up on)."""
        event_loop = asyncio.get_running_loop()
        clock = JobClock(Shape(job.width * job.height, job.steps_run, job.num_images), time.monotonic())

        def deliver(event: ModelEvent) -> None:  # the model side's thread
            if not isinstance(event, StepEvent):
                return
            self.metrics.denoise_steps.inc()
            try:
                event_loop.call_soon_threadsafe(on_step, event, clock)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        self.clock = clock
        if self._closing():
            stop.set()
        # Steps are posted with call_soon_threadsafe before the terminal future resolves, so every
        # step reaches its member before the end does.
        terminal = self.streamer.submit(job, stop, deliver, context=context)
        try:
            if not await wait_for_model(terminal, timeout=limit):
                # Past the limit: stop at the next step (a loop member leaves it; the others go on).
                # A model stuck inside one step cannot be interrupted; the callers are answered
                # anyway, and the gate still keeps the next job from running beside the stuck one.
                past_limit()
                if not await wait_for_model(terminal, timeout=TIMEOUT_GRACE_SECONDS):
                    self._mark_hung(terminal)
                return InferenceResult.ended_by("timed_out", f"past {limit:g} s", limit=limit)
        finally:
            if self.clock is clock:
                self.clock = None
        event = terminal.result()
        assert isinstance(event, InferenceResult)
        if event.ok:
            clock.finish(self.book, time.monotonic())
            return event
        if event.reason == "cancelled" and stop.steps_at_set is not None:
            self.metrics.steps_after_stop.observe(event.steps_done - stop.steps_at_set)
        if event.reason == "failed":
            log.error("job %s failed on the model side: %s\n%s", job.request_id, event.message, event.detail)
        return event

    def _mark_hung(self, terminal: concurrent.futures.Future[ModelEvent]) -> None:
        log.error("the model side is stuck in a job past its time limit")
        self.model_hung = True
        event_loop = asyncio.get_running_loop()

        def recovered() -> None:  # on the loop, the owner of model_hung
            self.model_hung = False
            log.warning("the stuck job has returned; the model side is free again")

        terminal.add_done_callback(lambda _f: event_loop.call_soon_threadsafe(recovered))

    def _deliver_step(
        self, entries: list[Entry], offsets: list[int], event: StepEvent, clock: JobClock, joinable: bool
    ) -> None:
        """One step to every entry (on the event loop), with the job's time left. An entry of a
        joinable batch on its last step tells the scheduler: its place may go to a joiner a step early."""
        now = time.monotonic()
        clock.on_step(event.step, event.total, now)
        eta = clock.remaining(self.book, now)
        for i, entry in enumerate(entries):
            rid, preview = entry.request.request_id, event.preview(offsets[i])
            entry.deliver(Output(rid, step=event.step, total=event.total, preview=preview, eta_seconds=eta))
        if joinable and event.total - event.step <= 1:
            self._reports.last_step(entries[0])


def _all_stopped(entries: list[Entry]) -> StopSignal:
    """A call's stop: set when every entry in it has stopped."""
    stop = StopSignal()

    def entry_stopped() -> None:
        if all(e.stop.is_set() for e in entries):
            stop.set()

    for entry in entries:
        entry.stop.on_set(entry_stopped)
    entry_stopped()
    return stop


async def wait_for_model(future: concurrent.futures.Future[Any], timeout: float | None = None) -> bool:
    """Wait for the model side to finish ``future``, even if this task is cancelled meanwhile.

    Returns whether it finished (False only when ``timeout`` ran out).
    """
    waiter = asyncio.wrap_future(future)
    event_loop = asyncio.get_running_loop()
    end = None if timeout is None else event_loop.time() + timeout
    while not waiter.done():
        try:
            remaining = None if end is None else max(0.0, end - event_loop.time())
            await asyncio.wait_for(asyncio.shield(waiter), remaining)
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            continue
        except BaseException:
            break
    if not waiter.cancelled():
        waiter.exception()  # mark it retrieved
    return True

"""One job on the model side, for the task that owns the gate: steps out, one end per member.

Step-level (``run_session``): the task that owns the gate runs a ``Session`` instead, a loop on
the model side that requests enter (``Line.take_joiners``, whenever the line moves) and leave on
their own: each member is its own joinable job there, with its own steps, stop, time limit and
end, and the gate opens when the last member has left.

``GpuJobs.run(batch)`` submits the batch's ``InferenceJob`` to the model-stream thread, relays each
step to every member (one event-loop wake-up per step for the whole batch), and ends every
member's stream with its share of the images or the job's error. It returns only when the model
side has left the job (or, past the time limit, has been given up on), so the gate it runs under
is never released while a job is still denoising. An out-of-memory error in a job of several
requests is retried once, one request at a time, before anyone gets an error.

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
from typing import Any, Callable

from ..errors import Cancelled, EngineDead, OutOfMemory
from ..protocol import ErrorEvent, InferenceJob, InferenceResult, ModelEvent, StepEvent
from .eta import EtaBook, JobClock, Shape
from .events import Step
from .line import Batch, End, Entry, Line, Session, StopSignal
from .metrics import Metrics
from .streamer import ModelStreamer

log = logging.getLogger(__name__)

TIMEOUT_GRACE_SECONDS = 2.0  # after a time limit, how long to wait for the model side to stop
# The default time limit (no --job-timeout), from the measured rate: twice the job's expected time
# (as if its loop were full) plus a floor, and before anything has been measured a fixed limit.
AUTO_LIMIT_FLOOR_SECONDS = 30.0
AUTO_LIMIT_FACTOR = 2.0
AUTO_LIMIT_UNMEASURED_SECONDS = 600.0


class TimedOut(Exception):
    """A job ran past its time limit, ``limit`` seconds (each request gets its own ``JobTimedOut``)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"past {limit:g} s")
        self.limit = limit


class ModelCrashed(Exception):
    """The model process died during the job (each request gets ``ModelProcessDied``), or its device
    failed and poisoned it (``device``: each request gets ``DeviceFailed``)."""

    def __init__(self, message: str, device: bool = False) -> None:
        super().__init__(message)
        self.device = device


class ModelFailed(Exception):
    """The model side failed the job (its detail is in the log; each request gets ``GenerationFailed``)."""


def error_of(event: ErrorEvent, request_id: str) -> BaseException:
    """An error value from the model side as the exception the serving side raises."""
    if event.kind == "cancelled":
        return Cancelled(event.message, steps_done=event.steps_done)
    if event.kind == "out_of_memory":
        return OutOfMemory(request_id)
    if event.kind in ("crashed", "device_lost"):
        return ModelCrashed(event.message, device=event.kind == "device_lost")
    if event.kind == "engine_dead":
        return EngineDead(event.message)
    return ModelFailed(event.message)


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
    ) -> None:
        self.streamer = streamer
        self.metrics = metrics
        self.job_timeout = job_timeout  # None: each job's limit follows the measured rate (time_limit)
        self.auto_floor = auto_floor
        self._closing = closing
        self.running: dict[int, StopSignal] = {}  # id(batch) -> the stop of the job on the model side
        self.model_hung = False  # a job ran past its limit and the model side has not returned yet
        self.book = EtaBook()  # measured rates per shape, for the ETA (eta.py)
        self.clock: JobClock | None = None  # the job on the model side now, as the ETA follows it

    def time_limit(self, job: InferenceJob) -> float:
        """Seconds ``job`` may run: ``--job-timeout``, else from the measured rate (see the constants).

        A joinable job is timed as if its loop held the most images it may (each step then draws
        them all), so a full loop does not time out its members.
        """
        if self.job_timeout is not None:
            return self.job_timeout
        images = max(job.num_images, job.loop_images_max)
        expected = self.book.job_seconds(Shape(job.width * job.height, job.num_inference_steps, images))
        if expected is None:
            return AUTO_LIMIT_UNMEASURED_SECONDS
        return round(self.auto_floor + AUTO_LIMIT_FACTOR * expected, 1)

    def stop_all(self) -> None:
        for stop in list(self.running.values()):
            stop.set()

    async def run(self, batch: Batch) -> None:
        """Run ``batch`` and end every member's stream. Never raises."""
        error = await self._attempt(batch)
        if self.retry_alone(error, batch):
            log.warning(
                "out of memory in a job of %d requests (%d images); retrying one request at a time",
                len(batch.members),
                batch.images,
            )
            self.metrics.oom_retries.inc()
            for member in batch.members:
                if member.stop.is_set():
                    member.deliver(End(error=Cancelled("cancelled before the retry")))
                elif (alone := await self._attempt(Batch([member]))) is not None:
                    member.deliver(End(error=alone))
        elif error is not None:
            for member in batch.members:
                member.deliver(End(error=error))

    @staticmethod
    def retry_alone(error: BaseException | None, batch: Batch) -> bool:
        return isinstance(error, (OutOfMemory, MemoryError)) and len(batch.members) > 1

    async def _attempt(self, batch: Batch) -> BaseException | None:
        """One job on the model side. On success every member gets its images; else returns the error."""
        job, members, offsets = batch.job(), batch.members, batch.offsets
        self.metrics.batch_images.observe(job.num_images)
        outcome = await self._on_model(
            job,
            batch.stop,
            members[0].context,  # the head's user
            lambda event, clock: self._deliver_step(members, offsets, event, clock),
        )
        if not isinstance(outcome, InferenceResult):
            return outcome
        for i, member in enumerate(members):
            share = dataclasses.replace(outcome, images=outcome.images[offsets[i] : offsets[i + 1]])
            member.deliver(End(result=share, batch_size=job.num_images, batch_requests=len(members)))
        return None

    async def _on_model(
        self,
        job: InferenceJob,
        stop: StopSignal,
        context: contextvars.Context | None,
        on_step: Callable[[StepEvent, JobClock], None],
    ) -> InferenceResult | BaseException:
        """Run ``job`` on the model side under the time limit; ``on_step`` gets each step on the event
        loop. Returns its result or its error only when the model side has left it (or, past the
        limit, has been given up on)."""
        loop = asyncio.get_running_loop()
        clock = JobClock(Shape(job.width * job.height, job.num_inference_steps, job.num_images), time.monotonic())

        def deliver(event: ModelEvent) -> None:  # the model side's thread
            if not isinstance(event, StepEvent):
                return
            self.metrics.denoise_steps.inc()
            try:
                loop.call_soon_threadsafe(on_step, event, clock)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        key = id(stop)
        self.running[key] = stop
        self.clock = clock
        if self._closing():
            stop.set()
        # Steps are posted with call_soon_threadsafe before the terminal future resolves, so every
        # step reaches its member before the end does.
        terminal = self.streamer.submit(job, stop, deliver, context=context)
        limit = self.time_limit(job)
        try:
            if not await wait_for_model(terminal, timeout=limit):
                # Past the limit: stop at the next step (a loop member leaves it; the others go on).
                # A model stuck inside one step cannot be interrupted; the callers are answered
                # anyway, and the gate still keeps the next job from running beside the stuck one.
                stop.set()
                if not await wait_for_model(terminal, timeout=TIMEOUT_GRACE_SECONDS):
                    self._mark_hung(terminal)
                return TimedOut(limit)
        finally:
            self.running.pop(key, None)
            if self.clock is clock:
                self.clock = None
        event = terminal.result()
        if isinstance(event, InferenceResult):
            clock.finish(self.book, time.monotonic())
            return event
        assert isinstance(event, ErrorEvent)
        if event.kind == "cancelled" and stop.steps_at_set is not None:
            self.metrics.steps_after_stop.observe(event.steps_done - stop.steps_at_set)
        if event.kind == "failed":
            log.error("job %s failed on the model side: %s\n%s", job.request_id, event.message, event.detail)
        return error_of(event, job.request_id)

    # -- step-level: a session of members that enter and leave a loop on the model side --------
    async def run_session(self, session: Session, line: Line) -> None:
        """Run ``session`` until nobody is left in it, taking joiners whenever the line moves. Never raises."""
        tasks: set[asyncio.Task[None]] = set()

        def start(members: list[Entry]) -> None:
            for peer in session.members:  # who shared the loop (an out-of-memory error is retried alone)
                peer.peers = max(peer.peers, len(session.members))
            for member in members:
                task = asyncio.create_task(self._member(member, session, line), name="gpu-member")
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        start(list(session.members))
        while True:
            moved = line.moved
            if self._closing():
                session.open = False
            start(line.take_joiners(session))
            if not session.members:
                session.open = False
                break
            await moved.wait()
        if tasks:  # members' tasks end after they leave; nothing is left on the model side
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _member(self, member: Entry, session: Session, line: Line) -> None:
        """One member's job in the loop: its steps, its time limit, its end. Then it leaves the session."""
        try:
            end = await self._member_attempt(member, session, line, joinable=True)
            if isinstance(end.error, (OutOfMemory, MemoryError)) and member.peers > 1 and not member.stop.is_set():
                self.metrics.oom_retries.inc()
                log.warning("out of memory in a loop of requests; retrying %s alone", member.request.request_id)
                end = await self._member_attempt(member, session, line, joinable=False)
            member.deliver(end)
        finally:
            session.leave(member)
            line.notify()  # room in the loop: the session may take joiners, or end

    async def _member_attempt(self, member: Entry, session: Session, line: Line, *, joinable: bool) -> End:
        job = dataclasses.replace(member.request.to_job(), joinable=joinable, loop_images_max=session.max_images)
        offsets = [0, job.num_images]
        outcome = await self._on_model(
            job,
            member.stop,
            member.context,
            lambda event, clock: self._deliver_member_step(member, line, offsets, event, clock),
        )
        if not isinstance(outcome, InferenceResult):
            return End(error=outcome)
        self.metrics.batch_images.observe(outcome.batch_images or job.num_images)
        return End(
            result=outcome,
            batch_size=outcome.batch_images or job.num_images,
            batch_requests=outcome.batch_jobs or 1,
            batching="step" if outcome.joined_at_step is not None else "job",
            joined_at_step=outcome.joined_at_step,
        )

    def _deliver_member_step(
        self, member: Entry, line: Line, offsets: list[int], event: StepEvent, clock: JobClock
    ) -> None:
        """A loop member's step; on its last step its place goes to the next joiner, a step early."""
        self._deliver_step([member], offsets, event, clock)
        if not member.last_step and event.total - event.step <= 1:
            member.last_step = True
            line.notify()

    def _mark_hung(self, terminal: concurrent.futures.Future[ModelEvent]) -> None:
        log.error("the model side is stuck in a job past its time limit")
        self.model_hung = True
        loop = asyncio.get_running_loop()

        def recovered() -> None:  # on the loop, the owner of model_hung
            self.model_hung = False
            log.warning("the stuck job has returned; the model side is free again")

        terminal.add_done_callback(lambda _f: loop.call_soon_threadsafe(recovered))

    def _deliver_step(self, members: list[Entry], offsets: list[int], event: StepEvent, clock: JobClock) -> None:
        """One step to every member (on the event loop), with the job's time left."""
        now = time.monotonic()
        clock.on_step(event.step, event.total, now)
        eta = clock.remaining(self.book, now)
        for i, member in enumerate(members):
            member.deliver(Step(event.step, event.total, event.preview(offsets[i]), eta))


async def wait_for_model(future: concurrent.futures.Future[Any], timeout: float | None = None) -> bool:
    """Wait for the model side to finish ``future``, even if this task is cancelled meanwhile.

    Returns whether it finished (False only when ``timeout`` ran out).
    """
    waiter = asyncio.wrap_future(future)
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    while not waiter.done():
        try:
            remaining = None if end is None else max(0.0, end - loop.time())
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

"""The line for the GPU: who waits, in a fair order across users, how many are ahead, and who shares a job.

``WaitLine`` is the "k ahead" both adapters report. ``Line`` adds dynamic batching for the local
adapter: the head of the line takes the compatible requests waiting behind it into one job
(``Batch``). Everything here is owned by the event loop; other threads reach it through the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import math
from dataclasses import dataclass, field
from typing import AsyncGenerator, Callable, Generic, Hashable, Iterable, TypeVar

from ..protocol import CountingStop, InferenceJob
from ..request import GenerateRequest
from .events import Step, Waiting
from .mailbox import End as End  # re-exported: the serving side reads End from here
from .mailbox import Mailbox

T = TypeVar("T")

REPORT_INTERVAL = 1.0  # seconds: at most one "k ahead" report a second per waiting request (read, not watched)


class StopSignal(CountingStop):
    """A request's or job's stop (``protocol.CountingStop``) that also calls listeners when set.

    ``note(step)`` is called in-process by the model thread itself, else by the thread that relays
    the job's steps; a model process forwards the stop through an ``on_set`` listener.
    """

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for listener in list(self._listeners):
            listener()

    def on_set(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the setting thread) whenever this signal is set."""
        self._listeners.append(listener)


class WaitLine(Generic[T]):
    """Tickets, a fair order over them, and a wake-up (``moved``) whenever the line or what it waits for moves.

    The order is round-robin across users: the user served longest ago (never: first, by arrival)
    leads, and each user's own tickets stay in arrival order (``order``). A ticket joined without a
    user is a user of its own, so a line of anonymous tickets is plain FIFO.
    """

    def __init__(self, report_interval: float = REPORT_INTERVAL) -> None:
        self.report_interval = report_interval
        self.tickets: dict[int, T] = {}
        self.users: dict[int, Hashable] = {}  # ticket -> its user
        self._served: dict[Hashable, int] = {}  # user -> when its request last went into a job
        self._serves = itertools.count()
        self._counter = itertools.count()
        self._order: list[int] | None = None  # the fair order, computed once per change of the line
        self._places: dict[int, int] = {}  # ticket -> its place in ``_order``
        self.moved = asyncio.Event()

    def join(self, item: T, user: Hashable | None = None) -> int:
        ticket = next(self._counter)
        self.tickets[ticket] = item
        self.users[ticket] = ("ticket", ticket) if user is None else user
        self._order = None
        return ticket

    def leave(self, ticket: int) -> None:
        self.users.pop(ticket, None)
        if self.tickets.pop(ticket, None) is not None:
            self._order = None
            self.notify()

    def remove(self, ticket: int) -> None:
        """Take ``ticket`` out of the line (a job took it); the caller notifies."""
        self.tickets.pop(ticket, None)
        self.users.pop(ticket, None)
        self._order = None

    def waiting(self, user: Hashable) -> int:
        """Tickets ``user`` has in line."""
        return sum(1 for u in self.users.values() if u == user)

    def served(self, users: Iterable[Hashable]) -> None:
        """These users' requests went into a job now: they go to the back of the round."""
        stamp = next(self._serves)
        self._order = None
        for user in users:
            self._served[user] = stamp
        if len(self._served) > 4 * len(self.tickets) + 64:  # forget users long gone
            waiting = set(self.users.values())
            self._served = {u: s for u, s in self._served.items() if u in waiting}

    def order(self) -> list[int]:
        """The tickets in fair order: round-robin across users, each user's own in arrival order.

        Computed once per change of the line (every waiting request asks on every move)."""
        if self._order is None:
            queues: dict[Hashable, list[int]] = {}
            for ticket in self.tickets:  # arrival order
                queues.setdefault(self.users[ticket], []).append(ticket)
            rotation = sorted(queues.values(), key=lambda q: (self._served.get(self.users[q[0]], -1), q[0]))
            self._order = [q[i] for i in range(max(map(len, rotation), default=0)) for q in rotation if i < len(q)]
            self._places = {ticket: i for i, ticket in enumerate(self._order)}
        return self._order

    def before(self, ticket: int) -> int:
        """Tickets ahead of ``ticket`` in the fair order (one that left: those that joined before it)."""
        if ticket not in self.tickets:
            return sum(1 for t in self.tickets if t < ticket)
        self.order()
        return self._places[ticket]

    def notify(self) -> None:
        self.moved.set()
        self.moved = asyncio.Event()

    async def turn(
        self, ticket: int, busy: Callable[[], int], done: Callable[[int], bool]
    ) -> AsyncGenerator[Waiting, None]:
        """``Waiting(k)`` when k (tickets ahead plus ``busy()``) changes, until ``done(k)``.

        The first at once, then at most one per ``report_interval``, with the count of when it is
        sent: a change inside the interval is reported when the interval is up, whether or not the
        line moves again. On a fast device the line moves every few milliseconds, and each report
        costs the caller's handler a full output (a diff and a message on the event loop).
        """
        loop = asyncio.get_running_loop()
        reported, reported_at = -1, -math.inf
        while True:
            moved = self.moved  # taken before the check, so no wake-up is missed
            ahead = self.before(ticket) + busy()
            if done(ahead):
                return
            if ahead != reported:
                if (wait := reported_at + self.report_interval - loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):  # the line moved, or the interval is up
                        await asyncio.wait_for(moved.wait(), wait)
                    continue
                reported, reported_at = ahead, loop.time()
                yield Waiting(ahead)
            await moved.wait()


@dataclass(eq=False)
class Entry:
    """A prepared request in line for the GPU, and then in a job."""

    request: GenerateRequest
    stop: StopSignal
    context: contextvars.Context | None = None  # the request's own (a batch runs in its head's)
    events: Mailbox = field(default_factory=lambda: Mailbox())
    ticket: int = -1
    batch: Batch | None = None  # set when a job takes this request
    session: Session | None = None  # set when a step-level loop takes this request
    peers: int = 1  # the most requests in its step-level loop while it was there
    last_step: bool = False  # step-level: it has one step left (its place may be promised to a joiner)
    user: Hashable | None = None  # who asked (None: a user of its own); the line is fair across users
    mixed_adapters: bool = False  # the model's loops take members with different LoRA adapters (lora_batching)

    def deliver(self, item: Step | End) -> None:
        """Put a step or the end on this request's stream (on the event loop's thread)."""
        self.events.put(item)

    @property
    def key(self) -> tuple[Hashable, ...]:
        """Requests with equal keys can share a job: the same size, steps, guidance, scheduler and LoRA
        adapter (at one scale), and a negative prompt on all or none (SDXL zeroes an all-empty one; one
        empty among others is encoded as "")."""
        r = self.request
        return (r.width, r.height, r.num_inference_steps, r.guidance_scale, bool(r.negative_prompt), r.scheduler,
                r.adapter)  # fmt: skip

    @property
    def taken(self) -> bool:
        return self.batch is not None or self.session is not None

    @property
    def loop_key(self) -> tuple[Hashable, ...]:
        """Requests with equal loop keys can share a step-level loop: the same size and sampler (they
        may differ in prompt, seed, image count, steps and guidance), and the same LoRA adapter and
        scale unless the model mixes adapters per row (then ``Session.admits`` keeps one scale each)."""
        r = self.request
        return (r.width, r.height, r.scheduler) if self.mixed_adapters else (r.width, r.height, r.scheduler, r.adapter)

    async def relay(self) -> AsyncGenerator[Step | End, None]:
        """This request's steps as its job runs, then its ``End``."""
        while True:
            item = await self.events.get()
            yield item
            if isinstance(item, End):
                return


class Batch:
    """Requests that run as one job. Its stop is set when every member has stopped (or by force)."""

    def __init__(self, members: list[Entry]) -> None:
        self.members = members
        self.stop = StopSignal()
        for member in members:
            member.batch = self
            member.stop.on_set(self._member_stopped)
        self._member_stopped()

    def _member_stopped(self) -> None:
        if self.all_stopped():
            self.stop.set()

    def all_stopped(self) -> bool:
        return all(m.stop.is_set() for m in self.members)

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
            scheduler=first.scheduler,
            lora=first.lora,  # the batch key holds one adapter and scale
            lora_scale=first.lora_scale,
        )


class Session:
    """The running step-level loop as the serving side sees it: its key, its members, its images.

    Owned by the event loop. Members enter through ``Line.take_joiners`` and leave when their own
    job ends; the task that holds the gate runs the session until nobody is left in it.
    """

    def __init__(self, key: tuple[Hashable, ...], max_images: int) -> None:
        self.key = key
        self.max_images = max_images
        self.members: list[Entry] = []
        self.open = True  # False: no more joiners (closing, or the gate is about to open)

    @property
    def images(self) -> int:
        """Images the loop must make room for: members on their last step are leaving, so a joiner
        may be sent for their place a step early (the model side holds it until the place is free)."""
        return sum(m.request.num_images for m in self.members if not m.last_step)

    def admits(self, member: Entry) -> bool:
        """Whether ``member``'s LoRA adapter can share this loop's calls: each adapter at one scale."""
        use = member.request.adapter
        return not use.name or all(m.request.adapter.name != use.name or m.request.adapter == use for m in self.members)

    def add(self, member: Entry) -> None:
        member.session = self
        self.members.append(member)

    def leave(self, member: Entry) -> None:
        if member in self.members:
            self.members.remove(member)


class Line(WaitLine[Entry]):
    """The local adapter's line: ``take_batch`` forms the head's job (dynamic batching)."""

    def join_member(self, member: Entry) -> None:
        member.ticket = self.join(member, member.user)

    @staticmethod
    def fits(images: int, member: Entry, max_images: int) -> bool:
        return images + member.request.num_images <= max_images

    def jobs_until(self, member: Entry, max_images: int) -> list[list[Entry]]:
        """The jobs the line would form, in order, up to the one that takes ``member`` (for the ETA).

        ``take_batch``'s rule applied again and again to the waiting requests, without changing the line.
        """
        waiting = [m for m in map(self.tickets.__getitem__, self.order()) if not m.stop.is_set()]
        jobs: list[list[Entry]] = []
        while waiting:
            head, rest = waiting[0], []
            job, images = [head], head.request.num_images
            for other in waiting[1:]:
                if other.key == head.key and self.fits(images, other, max_images):
                    job.append(other)
                    images += other.request.num_images
                else:
                    rest.append(other)
            jobs.append(job)
            if member in job:
                break
            waiting = rest
        return jobs

    def take_batch(self, head: Entry, max_images: int) -> Batch:
        """``head`` and, in the line's fair order, the waiting requests compatible with it that still fit.

        The head is always first in the fair order; a request passed over here keeps its place in its
        user's own order, and its user moves up the round when the users taken here go to its back.
        """
        members, images = [head], head.request.num_images
        for ticket in self.order():
            member = self.tickets[ticket]
            if member is head or member.stop.is_set() or member.key != head.key:
                continue
            if self.fits(images, member, max_images):
                members.append(member)
                images += member.request.num_images
                del self.tickets[ticket]
                self.users.pop(ticket, None)
        self.remove(head.ticket)
        self.served(m.user for m in members if m.user is not None)
        batch = Batch(members)
        self.notify()
        return batch

    def take_joiners(self, session: Session) -> list[Entry]:
        """Waiting requests that join ``session`` now, in the fair order: the longest run from the head
        of the line that share its key and fit (FIFO: a request that cannot join holds back those
        behind it, so a stream of joiners never starves it; the session then drains and it runs next)."""
        taken: list[Entry] = []
        if not session.open:
            return taken
        images = session.images
        for ticket in list(self.order()):
            member = self.tickets[ticket]
            if member.stop.is_set():
                continue  # leaving
            if member.loop_key != session.key or not self.fits(images, member, session.max_images):
                break
            if not session.admits(member):
                break
            images += member.request.num_images
            self.remove(ticket)
            session.add(member)
            taken.append(member)
        if taken:
            self.served(m.user for m in taken if m.user is not None)
            self.notify()
        return taken

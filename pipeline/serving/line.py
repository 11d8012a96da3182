"""The line for the GPU: who waits, in a fair order across users, and how many are ahead.

``WaitLine`` is the fair order and the "k ahead" both adapters report; the local adapter's
``scheduler.Scheduler`` decides from it who runs and who joins. ``StopSignal`` is a request's stop
on the serving side. Everything here is owned by the event loop; other threads reach it through the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from typing import AsyncGenerator, Callable, Generic, Hashable, Iterable, TypeVar

from ..protocol import CountingStop
from .events import Waiting
from .mailbox import End as End  # re-exported: the serving side reads End from here

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

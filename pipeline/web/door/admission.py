"""Per-identity admission at the front door: a rate of joins, open sessions, requests in flight,
failed logins, and who created each event.

Each limit answers at once, before Gradio creates anything for the request, so a flood from one
identity can neither queue work nor push other users' sessions out of Gradio's per-session caches
(its state holder keeps the newest 10,000 sessions and drops the oldest). Pure bookkeeping, owned
by the event loop (the front door calls it from there); the clock is injected for the tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from ...serving.decoding import Turns

MAX_IDENTITIES = 100_000  # identities remembered; the least recently seen is forgotten first
SESSION_IDLE_SECONDS = 20 * 60.0  # a session unseen this long no longer counts as open


@dataclass
class Bucket:
    tokens: float
    at: float


class TokenBucket:
    """``rate`` tokens a second per key, at most ``burst`` saved up; one token per admitted event."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    def take(self, key: str) -> float:
        """0 when admitted; else the seconds until a token is there (nothing is taken then)."""
        now = self._clock()
        bucket = self._buckets.pop(key, None) or Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        self._buckets[key] = bucket
        _forget_oldest(self._buckets)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.rate


class SessionBook:
    """Which identity owns each Gradio session hash, and how many open sessions each identity has.

    The first identity to use a session hash owns it; another identity using it is refused (it
    could read that session's results or cancel its jobs). An identity may have ``per_identity``
    sessions open; a session counts as open until it has gone unseen for ``idle`` seconds.
    """

    def __init__(
        self,
        per_identity: int,
        idle: float = SESSION_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_identity = per_identity
        self.idle = idle
        self._clock = clock
        self._owner: OrderedDict[str, str] = OrderedDict()  # session -> identity, least recently seen first
        self._sessions: dict[str, OrderedDict[str, float]] = {}  # identity -> {session: last seen}

    def claim(self, identity: str, session: str) -> str | None:
        """None when ``identity`` may use ``session`` (now seen); else why not ("foreign" or "too many")."""
        now = self._clock()
        owner = self._owner.get(session)
        if owner is not None and owner != identity:
            if self._open(owner, session, now):
                return "foreign"
            self._drop(owner, session)
        mine = self._sessions.setdefault(identity, OrderedDict())
        if session not in mine:
            self._expire(mine, now)
            if len(mine) >= self.per_identity:
                return "too many"
        mine.pop(session, None)
        mine[session] = now
        self._owner.pop(session, None)
        self._owner[session] = identity
        while len(self._owner) > MAX_IDENTITIES:
            old_session, old_owner = self._owner.popitem(last=False)
            self._drop(old_owner, old_session)
        return None

    def release(self, identity: str, session: str) -> None:
        """The session has closed (its page's heartbeat ended): it no longer counts, nor is owned."""
        if self._owner.get(session) == identity:
            del self._owner[session]
            self._drop(identity, session)

    def owner(self, session: str) -> str | None:
        return self._owner.get(session)

    def open_sessions(self, identity: str) -> int:
        mine = self._sessions.get(identity)
        if not mine:
            return 0
        self._expire(mine, self._clock())
        return len(mine)

    def _open(self, identity: str, session: str, now: float) -> bool:
        mine = self._sessions.get(identity)
        seen = mine.get(session) if mine is not None else None
        return seen is not None and now - seen < self.idle

    def _expire(self, mine: OrderedDict[str, float], now: float) -> None:
        while mine:
            session, seen = next(iter(mine.items()))
            if now - seen < self.idle:
                return
            del mine[session]
            self._owner.pop(session, None)

    def _drop(self, identity: str, session: str) -> None:
        mine = self._sessions.get(identity)
        if mine is not None:
            mine.pop(session, None)
            if not mine:
                del self._sessions[identity]


class InFlight:
    """Requests open now per identity (long-lived streams included), at most ``per_identity``."""

    def __init__(self, per_identity: int) -> None:
        self.per_identity = per_identity
        self.open: dict[str, int] = {}

    def enter(self, identity: str) -> bool:
        n = self.open.get(identity, 0)
        if n >= self.per_identity:
            return False
        self.open[identity] = n + 1
        return True

    def leave(self, identity: str) -> None:
        n = self.open.get(identity, 0) - 1
        if n > 0:
            self.open[identity] = n
        else:
            self.open.pop(identity, None)


def _forget_oldest(table: OrderedDict[str, Bucket]) -> None:
    while len(table) > MAX_IDENTITIES:
        table.popitem(last=False)


@dataclass
class Strikes:
    tries: float  # failed checks left before backoff (refills at ``refill`` a second)
    at: float  # the last failure
    until: float = 0.0  # no check before this time
    strikes: int = 0  # failures in this episode past the budget: each doubles the next backoff


class LoginMeter:
    """Failed credential checks per identity, on every route and header: a budget, then backoff.

    An identity may fail ``budget`` checks (a wrong password in the form, ``Authorization: Basic`` or
    ``Bearer``, or a wrong metrics token), refilled at ``refill`` a second. Past that, each failure
    starts a backoff: at least until one try has refilled, doubling with every further failure, at
    most ``cap`` seconds. During it the door answers 429 with ``Retry-After`` *before* it compares
    anything, the right password included. The episode ends after ``forgive`` seconds without a
    failure. A success takes nothing. Event loop only.
    """

    def __init__(
        self,
        budget: float = 10.0,
        refill: float = 1 / 6,
        cap: float = 300.0,
        forgive: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        on_backoff: Callable[[str, float], object] | None = None,
    ) -> None:
        self.budget = budget
        self.refill = refill
        self.cap = cap
        self.forgive = forgive
        self._clock = clock
        self.on_backoff = on_backoff  # told (identity, seconds) when an identity enters backoff
        self._table: OrderedDict[str, Strikes] = OrderedDict()

    def wait(self, key: str) -> float:
        """Seconds until ``key`` may present a credential again; 0: now."""
        entry = self._table.get(key)
        return 0.0 if entry is None else max(0.0, entry.until - self._clock())

    def failed(self, key: str) -> None:
        now = self._clock()
        entry = self._table.pop(key, None) or Strikes(self.budget, now)
        if now - entry.at > self.forgive:
            entry.strikes = 0  # quiet long enough: the episode is over
        entry.tries = min(self.budget, entry.tries + (now - entry.at) * self.refill) - 1
        entry.at = now
        if entry.strikes or entry.tries < 1:
            backoff = min(self.cap, max(1 / self.refill, 2.0**entry.strikes))
            entry.until = now + backoff
            if entry.strikes == 0 and self.on_backoff is not None:
                self.on_backoff(key, backoff)
            entry.strikes += 1
        self._table[key] = entry
        while len(self._table) > MAX_IDENTITIES:
            self._table.popitem(last=False)


class EventBook:
    """Which identity created each queued event (its id, as Gradio answered the join or call).

    A read of an event's results by its id (``/call/<api>/<event_id>``) or a cancel naming it is
    let through only for that identity. The newest ``MAX_IDENTITIES`` events are remembered. Event
    loop only.
    """

    def __init__(self) -> None:
        self._owner: OrderedDict[str, str] = OrderedDict()

    def add(self, event_id: str, identity: str) -> None:
        self._owner[event_id] = identity
        while len(self._owner) > MAX_IDENTITIES:
            self._owner.popitem(last=False)

    def owned_by(self, event_id: str, identity: str) -> bool:
        return self._owner.get(event_id) == identity

    def known(self, event_id: str) -> bool:
        return event_id in self._owner


class LargeBodies:
    """Turns to send a large body (``frontdoor.FrontDoor._large``): each identity one at a time, and at
    most ``at_once`` in all. While a body waits for its turn nothing reads it, so TCP holds its sender
    back. A sender that trickles its body holds its own identity's turn and one of the ``at_once``,
    never everyone's, and the connection's body timeout (``httplimits``) ends it. Event loop only."""

    def __init__(self, at_once: int = 2) -> None:
        self._all = asyncio.Semaphore(at_once)
        self.turns = Turns()  # each identity's

    async def take(self, identity: str) -> Callable[[], None]:
        """Wait for ``identity``'s turn and a free one in all; the function that gives both back (once)."""
        await self.turns.take(identity)
        try:
            await self._all.acquire()
        except BaseException:
            self.turns.give(identity)
            raise
        given = False

        def give() -> None:
            nonlocal given
            if not given:
                given = True
                self._all.release()
                self.turns.give(identity)

        return give


@dataclass
class LiveCalls:
    """MCP tool calls whose caller is still connected (the handler stops a call's job when it goes).

    The front door adds a call when its request starts and drops it when the request ends or its
    client disconnects; the handler's liveness check reads it. Event loop only.
    """

    open: set[str] = field(default_factory=set)

    def alive(self, call: str) -> bool:
        """Whether call ``call`` is still connected; "" (a call the door does not follow) always is."""
        return not call or call in self.open

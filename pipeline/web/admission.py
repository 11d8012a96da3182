"""Per-identity admission at the front door: a rate of joins, open sessions, requests in flight.

Each limit answers at once, before Gradio creates anything for the request, so a flood from one
identity can neither queue work nor push other users' sessions out of Gradio's per-session caches
(its state holder keeps the newest 10,000 sessions and drops the oldest). Pure bookkeeping, owned
by the event loop (the front door calls it from there); the clock is injected for the tests.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

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

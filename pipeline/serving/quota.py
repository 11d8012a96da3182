"""A per-identity budget of images per hour (``--quota-images-per-hour``; off by default): a quota of work.

Counted where every protocol meets, the adapter's ``run`` (the page, ``gradio_client``, MCP,
AUTOMATIC1111's ``/sdapi/v1`` and OpenAI's ``/v1/images`` all enter there), under the caller's
*account* (``identity.Caller.account``: a ``--auth`` login wherever it connects from, a Hugging Face
user, else the address's network, an IPv6 one by its /56). A request's images are taken from its
account's hour when it is accepted (its fields checked, before it waits or any picture of it is
decoded). They are spent once its job has run a step: an interrupt at the last step, or a stream
dropped after its previews, costs what it ran, as its previews showed the picture. Only a request
that ends before its first step (refused later, cancelled while waiting, failed to start) gets them
back. Past the budget the request is refused at once with ``QuotaExceeded`` (429 with
``Retry-After`` on the HTTP APIs), in words that say when the next image is possible; a request
for more images than the whole hour holds can never fit, and is refused by name (``num_images``).

A sliding hour: each request's images count for 3600 s from when it was accepted. Owner: the
event loop (the adapter's ``run``); nothing here blocks.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Callable, Iterator

from ..errors import InvalidRequest, QuotaExceeded

HOUR = 3600.0


class Held:
    """A request's images taken from its hour: spent once its job has run a step (``ran``), or its
    images were delivered (``keep``)."""

    kept = False

    def keep(self) -> None:
        self.kept = True

    def ran(self) -> None:
        """Its job has run a step: the work was done for it, whatever ends it now."""
        self.keep()


class ImageQuota:
    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = per_hour
        self._clock = clock
        self._taken: dict[str, collections.deque[tuple[float, int]]] = {}

    def used(self, user: str) -> int:
        return sum(n for _, n in self._live(user))

    @contextlib.contextmanager
    def held(self, user: str | None, images: int) -> Iterator[Held]:
        """Take ``images`` from ``user``'s hour for the request inside; give them back if it ends by
        an exception before ``Held.keep`` (its job's first step). ``QuotaExceeded`` if they do not
        fit now, ``InvalidRequest`` if they never could. None (no identity): not counted."""
        held = Held()
        if user is None:
            yield held
            return
        entry = self.take(user, images)
        try:
            yield held
        except BaseException:
            if not held.kept:
                self._give_back(user, entry)
            raise

    def take(self, user: str, images: int) -> tuple[float, int]:
        if images > self.per_hour:
            raise InvalidRequest(
                "num_images",
                f"num_images must be at most {self.per_hour}: the quota (--quota-images-per-hour) is "
                f"{self.per_hour} images an hour; got {images}",
            )
        live, now = self._live(user), self._clock()
        used = sum(n for _, n in live)
        if used + images > self.per_hour:
            raise QuotaExceeded(self.per_hour, used, images, self._wait(live, used + images - self.per_hour, now))
        entry = (now, images)
        live.append(entry)
        return entry

    def _give_back(self, user: str, entry: tuple[float, int]) -> None:
        live = self._taken.get(user)
        if live is not None and entry in live:
            live.remove(entry)

    def _live(self, user: str) -> collections.deque[tuple[float, int]]:
        live = self._taken.setdefault(user, collections.deque())
        now = self._clock()
        while live and live[0][0] <= now - HOUR:
            live.popleft()
        if not live:
            self._taken.pop(user, None)
            live = self._taken.setdefault(user, collections.deque())
        return live

    @staticmethod
    def _wait(live: collections.deque[tuple[float, int]], over: int, now: float) -> float:
        """Seconds until ``over`` images of the hour have aged out (the request then fits)."""
        freed = 0
        for at, n in live:
            freed += n
            if freed >= over:
                return max(1.0, at + HOUR - now)
        return HOUR  # not reached: more images than the whole budget are refused by ``take``

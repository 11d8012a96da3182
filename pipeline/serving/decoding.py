"""Client pictures are decoded apart from everything else: in a pool of their own, one request at a time per identity.

Decoding a picture is the one piece of preparing a request whose cost the client picks: a header's
size, a PNG's chunks, a JPEG's scans. ``uploads`` caps each (up to about a second of CPU at the
caps), and this module keeps what is left from reaching anyone else:

- the decodes run on the ``decode`` threads, never on the ``prep-finalize`` pool that encodes every
  user's results, nor on the loop's default pool that answers and previews wait on;
- those threads ask for less CPU than the rest (``yield_cpu``): a flood of pictures slows itself,
  not the model's steps or the event loop;
- each identity decodes one request's pictures at a time (the others wait their turn on the loop,
  which costs nothing), so a flood from one identity holds one decode thread and another
  identity's pictures take the next;
- a decode is started only after every gate that can refuse the request without it (its fields,
  the quota, the waiting cap: ``LocalAdapter.run``); a request cancelled meanwhile holds its
  identity's turn until its thread is done, so cancelling cannot start decodes side by side.

Owner: the event loop (the turns); the pool's threads run only the decodes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from functools import partial
from typing import Any, Callable, TypeVar

T = TypeVar("T")
DECODE_THREADS = 2
CLIENT_WORK_NICE = 10  # how much less CPU the threads of client-chosen work ask for (Linux: per thread)


def yield_cpu() -> None:
    """Lower this thread's CPU priority (the decode pool's ``initializer``): decoding a client's pictures,
    work whose size the client chooses, takes what the model and the event loop leave, so a flood of
    it slows the flood, not everyone's steps. Pillow decodes with the GIL released, so a thread put
    last by the OS holds nobody up (the ``big-body`` thread, which holds the GIL, keeps its priority:
    ``web.door.asgi``). Where threads have no nice value of their own (not Linux), nothing changes."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CLIENT_WORK_NICE)


class Turns:
    """One at a time per key (an identity): each key's ``asyncio.Lock``, forgotten once nobody holds
    or waits for it. Event loop only."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> its lock, and who holds or waits for it

    def __bool__(self) -> bool:
        return bool(self._locks)

    async def take(self, key: str) -> None:
        """Wait for ``key``'s turn (``give`` it back once)."""
        lock, holders = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, holders + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._forget(key)
            raise

    def give(self, key: str) -> None:
        self._locks[key][0].release()
        self._forget(key)

    def _forget(self, key: str) -> None:
        lock, holders = self._locks[key]
        if holders <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, holders - 1)


class Decoder:
    """The ``decode`` threads and each identity's turn at them."""

    def __init__(self, threads: int = DECODE_THREADS) -> None:
        self.threads = threads
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="decode", initializer=yield_cpu)
        self._turns = Turns()  # identity -> its turn
        self.active = 0  # decodes running now (the event loop's count)

    async def run(self, user: str | None, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a decode thread, once ``user`` has no other decode running. None: a user of its own."""
        if user is not None:
            await self._turns.take(user)
        loop = asyncio.get_running_loop()
        try:
            future = self._pool.submit(partial(fn, *args))
        except BaseException:
            self._leave(user)
            raise
        self.active += 1

        def done(_future: concurrent.futures.Future[T]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._ended, user)

        # The turn passes on when the thread is done, not when its waiter is: a cancelled request's
        # decode still holds its identity's turn until it ends.
        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    def _ended(self, user: str | None) -> None:
        self.active -= 1
        self._leave(user)

    def _leave(self, user: str | None) -> None:
        if user is not None:
            self._turns.give(user)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

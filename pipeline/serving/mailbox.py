"""A request's stream of steps and its end, as the event loop hands them to the request's consumer.

``End`` is a request's last item (its result or error, and how it was batched); ``Mailbox`` holds
what the consumer has not read yet: a step it has not read is replaced by a newer one (keeping a
preview), so a consumer that is behind gets the latest step, never a backlog. The end is never
coalesced. Owned by the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from dataclasses import dataclass

from ..protocol import FinishReason, InferenceResult
from .events import Step


@dataclass(frozen=True)
class End:
    """The last item on a request's stream: why it ended (``protocol.FinishReason``) and, when done,
    its share of the job's images; else the model side's or the scheduler's words, for the log."""

    reason: FinishReason = "done"
    result: InferenceResult | None = None
    message: str = ""
    steps_done: int = 0  # cancelled: the steps it ran
    limit: float = 0.0  # timed_out: the time limit, in seconds
    batch_size: int = 1  # images in the job this request ran in (step-level: the most its loop held)
    batch_requests: int = 1  # requests in that job (step-level: the most its loop held)
    batching: str = "job"  # job: one call for the whole batch; step: a step-level loop (engine.loop.joining)
    joined_at_step: int | None = None  # step-level: loop steps run before it joined


class Mailbox:
    """A request's steps, then its end, as its consumer reads them: coalesced when it is behind.

    A step that arrives while the one before it is still unread replaces it (carrying that one's
    preview if it has none of its own): a page or a program that falls behind gets the latest
    step and the latest preview, never a backlog of stale ones. The end is never coalesced.
    Owner: the event loop (``put`` and ``get`` run there only).
    """

    def __init__(self) -> None:
        self._items: collections.deque[Step | End] = collections.deque()
        self._ready = asyncio.Event()
        self.coalesced = 0  # steps replaced before they were read

    def put(self, item: Step | End) -> None:
        if isinstance(item, Step) and self._items and isinstance(self._items[-1], Step):
            unread = self._items[-1]
            if item.preview is None and unread.preview is not None:
                item = dataclasses.replace(item, preview=unread.preview)
            self._items[-1] = item
            self.coalesced += 1
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> Step | End:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

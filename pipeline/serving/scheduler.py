"""The one scheduler: who runs next, who joins the running batch at a step boundary, who waits.

Every request the local adapter has prepared is an ``Entry`` here, and ``Scheduler.schedule`` is the
only place that decides what happens to it, the way vLLM's ``Scheduler.schedule`` is:

- **Who runs next.** With the gate free, the head of the fair line (``line.WaitLine``: round-robin
  across users, each user's own in arrival order) opens a ``Batch`` with the waiting entries that can
  share its denoiser calls, up to ``max_images`` images.
- **Who joins.** While a joinable batch runs (a step-level loop on the model side), the longest run
  of entries from the head of the fair line that can share it enters at the next step boundary. A
  request that cannot join stops the run, so compatible requests from others never overtake it: it
  waits for the members already in the loop, then runs next. An entry joins only while its images
  fit the batch (``max_images``) and the device's memory (``MemoryRoom``), its LoRA at one scale.
- **Who waits,** how many are ahead and, through ``plan_until``, which batches run before it (the
  ETA), all from the same state and the same rules.

A joinable batch hands each entry to the model side as its own job, tagged with the batch's
``loop_id``; the model thread admits what is tagged for its running loop and decides nothing (an
entry sent a step early, for the place of members on their last step, names them in
``enters_after``). A closed batch (no step-level loop for this model, or joining off) enters all at
step 0 and runs as one whole-pipeline call. ``jobs.GpuJobs`` runs both.

Here too, what the scheduler is built from: the fair line (``WaitLine``: its order, "k ahead", the
wake-up when it moves; the Ray adapter uses it alone) and a request's ``Mailbox`` (its steps,
coalesced when its consumer is behind, then its end).

Owner: the event loop. Nothing here holds a lock; other threads reach it through the loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import AsyncGenerator, Callable, Collection, Generic, Hashable, Iterable, TypeVar

from ..fields import CHUNK_KEYED
from ..protocol import InferenceJob, InferenceResult, ModelProfile, Output, StopSignal
from ..protocol import loop_key as protocol_loop_key
from ..request import GenerateRequest

T = TypeVar("T")

HEADROOM = 0.9  # of the device's memory: the allocator's fragmentation and the decode's extra


@dataclass(eq=False)
class Entry:
    """A prepared request, from the line through its batch to its end."""

    request: GenerateRequest
    stop: StopSignal
    context: contextvars.Context | None = None  # the request's own (a closed batch runs in its head's)
    events: Mailbox = field(default_factory=lambda: Mailbox())
    ticket: int = -1  # its place in the line
    batch: Batch | None = None  # set when a batch takes it
    peers: int = 1  # the most entries in its batch while it was there (an out-of-memory error is retried alone)
    last_step: bool = False  # in a joinable batch: one step left (its place may go to a joiner a step early)
    user: Hashable | None = None  # who asked (None: a user of its own); the line is fair across users

    def deliver(self, item: Output | InferenceResult) -> None:
        """Put a step or the end on this request's stream (on the event loop's thread)."""
        self.events.put(item)

    @property
    def taken(self) -> bool:
        return self.batch is not None

    @property
    def images(self) -> int:
        return self.request.num_images


def batch_key(request: GenerateRequest) -> tuple[Hashable, ...]:
    """Requests with equal keys can share one whole-pipeline call: the same size, steps, guidance,
    scheduler and LoRA (at one scale), and a negative prompt on all or none (SDXL zeroes an
    all-empty one; one empty among others is encoded as ""); the same mode and strength (each
    picture its own), and the same hires fix; and prompts of one CLIP chunk count (``prompt_weights``:
    a call pads every text to its longest, which would change a shorter prompt's picture)."""
    r, p = request, request.pictures
    control = tuple(v for k, v in r.options if k.startswith("control"))  # one ControlNet, scale and window a call
    return (*r.job_size, r.num_inference_steps, r.guidance_scale, bool(r.negative_prompt), r.sampler,
            r.lora_use, p.pipeline_mode, p.strength, p.hires, r.prompt_chunks, control, r.model)  # fmt: skip


def joins_loops(request: GenerateRequest, loop_modes: Collection[str] = ("text",)) -> bool:
    """Whether ``request`` may run in a step-level loop: its mode is one the model's loops take
    (``ModelProfile.loop_modes``: text, and image-to-image where the family's loop starts from a
    picture), without hires fix (its second pass runs as a whole-pipeline call); inpainting and
    outpainting run as whole-pipeline calls. A request with a ControlNet joins only where the loops run
    one per member (``loop_modes`` has "control": the SD 1.x/2.x and FLUX.1 loops, ``engine.loop.control``)."""
    return (request.pictures.pipeline_mode in loop_modes and request.pictures.hires is None
            and (not controlled(request) or "control" in loop_modes))  # fmt: skip


def controlled(request: GenerateRequest) -> bool:
    """Whether ``request`` picked a ControlNet (issue 51)."""
    return dict(request.options).get("control", "none") != "none"


def loop_key(request: GenerateRequest, mixed_loras: bool) -> tuple[Hashable, ...]:
    """``protocol.loop_key`` of a request (the model side reads the same function on its jobs); where
    the model mixes LoRAs per row, ``Batch.admits`` keeps one scale each. Where a family's loop cannot
    mask a shorter prompt (``fields.CHUNK_KEYED``: SD3), its CLIP chunk count too."""
    r = request
    key = protocol_loop_key(r.width, r.height, r.sampler, r.lora_use, per_lora=not mixed_loras, model=r.model)
    return (*key, r.prompt_chunks) if r.family in CHUNK_KEYED else key


class Batch:
    """Entries that share denoiser calls on the model side: the one running batch, or a planned one.

    Closed (``joinable`` False): every entry enters at step 0 and the model runs them as one call.
    Joinable: a step-level loop; entries enter at step boundaries and leave when their own steps are
    done. The batch ends, and the gate opens, when its last entry has left.
    """

    _ids = itertools.count(1)

    def __init__(self, key: tuple[Hashable, ...], joinable: bool, max_images: int) -> None:
        self.key = key
        self.joinable = joinable
        self.max_images = max_images
        self.loop_id = next(self._ids) if joinable else 0
        self.entries: list[Entry] = []
        self.open = joinable  # False: no more joiners (closed, closing, or over)

    @property
    def images(self) -> int:
        return sum(e.images for e in self.entries)

    @property
    def staying(self) -> int:
        """Images that stay past the next step (entries on their last step are leaving)."""
        return sum(e.images for e in self.entries if not e.last_step)

    def admits(self, entry: Entry) -> bool:
        """Whether ``entry``'s LoRA can share this batch's calls: each LoRA at one scale."""
        use = entry.request.lora_use
        return not use.name or all(
            e.request.lora_use.name != use.name or e.request.lora_use == use for e in self.entries
        )

    def add(self, entry: Entry) -> None:
        entry.batch = self
        self.entries.append(entry)
        for e in self.entries:
            e.peers = max(e.peers, len(self.entries))

    def leave(self, entry: Entry) -> None:
        if entry in self.entries:
            self.entries.remove(entry)
        if not self.entries:
            self.open = False

    def enters_after(self) -> tuple[str, ...]:
        """The request ids a joiner sent now enters after: the entries on their last step (the step-early
        hand-off, one name across the scheduler, ``InferenceJob.enters_after`` and the model thread's
        ``joining.enters_after_members``)."""
        return tuple(e.request.request_id for e in self.entries if e.last_step)


def call_job(entries: list[Entry]) -> InferenceJob:
    """One whole-pipeline call for the entries of a closed batch (they share ``batch_key``)."""
    jobs = [e.request.to_job() for e in entries]
    offsets = image_offsets(entries)
    # The batch key makes every other field (size, steps, guidance, sampler, LoRA, mode, strength,
    # hires fix, ControlNet and its weight and window) the same for all: the first job's. Per image: prompts,
    # seeds, pictures, control maps.
    return dataclasses.replace(
        jobs[0],
        request_id=",".join(j.request_id for j in jobs),
        prompts=tuple(p for j in jobs for p in j.prompts),
        negative_prompts=tuple(p for j in jobs for p in j.negative_prompts),
        seeds=tuple(seed for j in jobs for seed in j.seeds),
        preview_every=max(j.preview_every for j in jobs),
        preview_images=tuple(offsets[i] for i, j in enumerate(jobs) if j.preview_every),
        images=tuple(image for j in jobs for image in j.images),
        masks=tuple(mask for j in jobs for mask in j.masks),
        controls=tuple(map_ for j in jobs for map_ in j.controls),  # each image its own ControlNet map
    )


def image_offsets(entries: list[Entry]) -> list[int]:
    """Where each entry's images start in a call (and, last, the call's image count)."""
    return list(itertools.accumulate((e.images for e in entries), initial=0))


class MemoryRoom:
    """Whether a joiner fits beside a running loop, from the device memory the jobs so far have used.

    A joiner that would not fit must wait for the next batch instead of entering and failing everyone
    in the loop with an out-of-memory error. The figure is measured, not guessed: the model side
    reports with each result its device's total memory, its idle footprint (the weights) and the
    job's peak; the peak above the idle footprint, per image and pixel, the largest seen so far,
    says what a loop of n images at a size needs. A joiner fits while ``base + per_pixel * (images in
    the loop + its images) * width * height`` stays under ``HEADROOM`` of the device. Until a job has
    been measured on a device that reports memory (not the CPU), everything fits.

    ControlNets (issue 51): their weights are in the idle footprint (loaded at start, beside the model);
    their activations are learned apart (``per_pixel_control``, from jobs with a control: a loop's peak
    with controlled members), and a loop where a ControlNet runs (a controlled joiner, or one already
    in it) is held to the larger of the two figures. Until a job with a control has been measured,
    a controlled joiner does not join a loop the plain figure admits: it waits for a batch of its own,
    whose peak then measures it.
    """

    def __init__(self) -> None:
        self.total: int | None = None
        self.base: int | None = None
        self.per_pixel = 0.0
        self.per_pixel_control = 0.0

    def learn(self, width: int, height: int, images: int, result: InferenceResult, control: bool = False) -> None:
        total, base, peak = result.device_total_bytes, result.idle_bytes, result.peak_memory_bytes
        if total is None or base is None or peak is None or images < 1:
            return
        self.total, self.base = total, base
        rate = max(0, peak - base) / (images * width * height)
        if control:
            self.per_pixel_control = max(self.per_pixel_control, rate)
        else:
            self.per_pixel = max(self.per_pixel, rate)

    def fits(self, width: int, height: int, loop_images: int, images: int, control: bool = False) -> bool:
        """``control``: a ControlNet runs in the loop (the joiner's or a member's)."""
        if self.total is None or self.base is None or not (self.per_pixel or self.per_pixel_control):
            return True
        if control and not self.per_pixel_control:
            return False  # not yet measured: a batch of its own first
        rate = max(self.per_pixel, self.per_pixel_control) if control else self.per_pixel or self.per_pixel_control
        return self.base + rate * (loop_images + images) * width * height <= HEADROOM * self.total


@dataclass(frozen=True)
class Join:
    """An entry that enters the running batch now, after the entries named in ``enters_after`` have left."""

    entry: Entry
    enters_after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Looping:
    """How one model's requests share loops: step-level loops on the model side (``joining``), the modes
    whose requests enter them (``ModelProfile.loop_modes``), entries with different LoRAs in one loop."""

    joining: bool
    loop_modes: frozenset[str] = frozenset({"text"})
    mixed_loras: bool = False


def looping(profile: ModelProfile, joining: bool) -> Looping:
    """A model's ``Looping`` from its profile (``joining``: the server joins requests step-level at all)."""
    return Looping(joining and profile.step_joining, frozenset(profile.loop_modes), profile.lora_batching == "mixed")


class Scheduler:
    """The fair line, the running batch and every decision about them (see the module docstring).

    Several models (issue 52): a batch holds one model (``batch_key`` and ``loop_key`` carry it), so the
    head of the fair line picks the next batch's model; a new batch takes its model's waiting requests
    past those of other models (they wait for a switch anyway), and a request for another model at the head
    of the line stops the joining: it waits for the running loop's members, then its model's batch opens
    (``models``: each model's ``Looping`` by name; the default's are the arguments)."""

    def __init__(
        self,
        max_images: int,
        *,
        joining: bool,
        mixed_loras: bool,
        line: WaitLine[Entry],
        loop_modes: Collection[str] = ("text",),
        models: dict[str, Looping] | None = None,
    ) -> None:
        self.max_images = max_images
        self.looping = Looping(joining, frozenset(loop_modes), mixed_loras)  # the default model's
        self.models = models or {}  # the others', by name
        self.line = line
        self.running: Batch | None = None
        self.memory = MemoryRoom()

    def _looping(self, request: GenerateRequest) -> Looping:
        return self.models.get(request.model, self.looping)

    def _joins(self, request: GenerateRequest) -> bool:
        """Whether ``request`` may run in one of its model's step-level loops."""
        looping = self._looping(request)
        return looping.joining and joins_loops(request, looping.loop_modes)

    def _loop_key(self, request: GenerateRequest) -> tuple[Hashable, ...]:
        return loop_key(request, self._looping(request).mixed_loras)

    # -- the line --------------------------------------------------------------------------------
    def add(self, entry: Entry) -> None:
        entry.ticket = self.line.join(entry, entry.user)
        self.line.notify()  # the gate may be free, or a running loop may take it at its next step

    def leave(self, entry: Entry) -> None:
        self.line.leave(entry.ticket)

    def waiting(self, user: Hashable, *, gate_free: bool = False) -> int:
        """Entries ``user`` has in line that will wait. With the gate free, those in the batch the
        scheduler opens next are on their way in, not waiting: two requests sent together while
        nothing runs are one running and one waiting, whichever of them the scheduler has seen."""
        n = self.line.waiting(user)
        if gate_free and n and (fair := self._fair()):
            n -= sum(1 for e in self._compose(fair[0], fair, take=False).entries if e.user == user)
        return n

    def _fair(self) -> list[Entry]:
        return [e for e in map(self.line.tickets.__getitem__, self.line.order()) if not e.stop.is_set()]

    # -- the decisions ---------------------------------------------------------------------------
    def schedule(self, *, closing: bool, gate_free: bool) -> tuple[Batch | None, list[Join]]:
        """What runs now: a batch to open (only when the gate is free: nothing is running), and the
        entries that join the running batch at its next step boundary. Called whenever the line or
        the batch moves."""
        running = self.running
        if running is not None and (closing or not running.entries):
            running.open = False
        if gate_free:
            if closing or not (fair := self._fair()):
                return None, []
            batch = self._compose(fair[0], fair, take=True)
            self.running = batch
            return batch, []
        if running is None or not running.open:
            return None, []
        return None, self._joiners(running, self._fair(), take=True)

    def fits(self, images: int, entry: Entry) -> bool:
        """Whether ``entry``'s images fit beside ``images`` in one batch (``max_batch_size``)."""
        return images + entry.images <= self.max_images

    # -- what the job runner reports (``jobs.GpuJobs``): the only changes to entries and batches after
    #    they are taken, so every decision reads state that this class alone writes
    def last_step(self, entry: Entry) -> None:
        """``entry``, in a joinable batch, is on its last step: its place may go to a joiner sent a step
        early (``Batch.enters_after``)."""
        if not entry.last_step:
            entry.last_step = True
            self.line.notify()

    def left(self, batch: Batch, entries: list[Entry]) -> None:
        """These entries' job has ended: they leave ``batch`` (room for joiners, or the batch's end)."""
        for entry in entries:
            batch.leave(entry)
        self.line.notify()

    def ended(self, batch: Batch) -> None:
        """The batch's last entry has left and the model side is done with it: the gate opens."""
        if self.running is batch:
            self.running = None
        self.line.notify()

    def _compose(self, head: Entry, fair: list[Entry], *, take: bool) -> Batch:
        """The batch ``head`` opens with the entries behind it in ``fair`` that share it now."""
        if self._joins(head.request):
            batch = Batch(self._loop_key(head.request), True, self.max_images)
            self._enter(batch, head, take)
            if take:
                self.line.served([head.user] if head.user is not None else [])
                self.line.notify()
            rest = fair[1:] if fair and fair[0] is head else fair
            # Several models: a request for another model waits for a switch whatever this loop holds, so
            # the loop opens with its model's run past it (one loop, then its turn: the bound holds); a
            # request of this model that cannot share the loop still stops the run, as with one model.
            self._joiners(batch, [e for e in rest if e.request.model == head.request.model], take=take)
            return batch
        # A closed batch: the compatible entries that fit, in the fair order; one passed over keeps its
        # place in its user's own order, and its user moves up the round when these go to its back.
        batch = Batch(batch_key(head.request), False, self.max_images)
        self._enter(batch, head, take)
        for entry in fair:
            if entry is head or batch_key(entry.request) != batch.key:
                continue
            if self.fits(batch.images, entry):
                self._enter(batch, entry, take)
        if take:
            self.line.served(e.user for e in batch.entries if e.user is not None)
            self.line.notify()
        return batch

    def _joiners(self, batch: Batch, fair: list[Entry], *, take: bool) -> list[Join]:
        """The longest run from the head of ``fair`` that can join ``batch`` now (FIFO: an entry that
        cannot join holds back those behind it, so a stream of joiners never starves it)."""
        joins: list[Join] = []
        staying, images = batch.staying, batch.images
        for entry in fair:
            r = entry.request
            if not self._joins(r) or self._loop_key(r) != batch.key:
                break
            if not batch.admits(entry):
                break
            if not self.fits(staying, entry):
                break
            control = controlled(r) or any(controlled(e.request) for e in batch.entries)
            if not self.memory.fits(r.width, r.height, staying, entry.images, control):
                break
            # Room now (in the batch and in memory beside every member), or a step early: the place of
            # the entries on their last step, which the memory check above already counted as gone.
            room_now = self.fits(images, entry) and self.memory.fits(r.width, r.height, images, entry.images, control)
            enters_after = () if room_now else batch.enters_after()
            staying += entry.images
            images += entry.images
            self._enter(batch, entry, take)
            joins.append(Join(entry, enters_after))
        if take and joins:
            self.line.served(j.entry.user for j in joins if j.entry.user is not None)
            self.line.notify()
        return joins

    def _enter(self, batch: Batch, entry: Entry, take: bool) -> None:
        if take:
            self.line.remove(entry.ticket)
            batch.add(entry)
        else:
            batch.entries.append(entry)

    # -- the plan, for the ETA -------------------------------------------------------------------
    def plan_until(self, entry: Entry) -> list[list[Entry]]:
        """The batches the line would form, in order, up to the one that takes ``entry``: the same
        rules as ``schedule`` applied again and again to the waiting entries, changing nothing."""
        waiting = self._fair()
        plan: list[list[Entry]] = []
        while waiting:
            batch = self._compose(waiting[0], waiting, take=False)
            plan.append(batch.entries)
            if entry in batch.entries:
                break
            taken = set(map(id, batch.entries))
            waiting = [e for e in waiting if id(e) not in taken]
        return plan


# -- the fair line and a request's mailbox ----------------------------------------------------------
REPORT_INTERVAL = 1.0  # seconds: at most one "k ahead" report a second per waiting request (read, not watched)


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
    ) -> AsyncGenerator[Output, None]:
        """``Output(ahead=k)`` when k (tickets ahead plus ``busy()``) changes, until ``done(k)``.

        The first at once, then at most one per ``report_interval``, with the count of when it is
        sent: a change inside the interval is reported when the interval is up, whether or not the
        line moves again. On a fast device the line moves every few milliseconds, and each report
        costs the caller's handler a full output (a diff and a message on the event loop).
        """
        event_loop = asyncio.get_running_loop()
        reported, reported_at = -1, -math.inf
        while True:
            moved = self.moved  # taken before the check, so no wake-up is missed
            ahead = self.before(ticket) + busy()
            if done(ahead):
                return
            if ahead != reported:
                if (wait := reported_at + self.report_interval - event_loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):  # the line moved, or the interval is up
                        await asyncio.wait_for(moved.wait(), wait)
                    continue
                reported, reported_at = ahead, event_loop.time()
                yield Output(ahead=ahead)
            await moved.wait()


class Mailbox:
    """A request's steps, then its end, as its consumer reads them: coalesced when it is behind.

    A step that arrives while the one before it is still unread replaces it (carrying that one's
    preview if it has none of its own): a page or a program that falls behind gets the latest
    step and the latest preview, never a backlog of stale ones. The end is never coalesced.
    Owner: the event loop (``put`` and ``get`` run there only).
    """

    def __init__(self) -> None:
        self._items: collections.deque[Output | InferenceResult] = collections.deque()
        self._ready = asyncio.Event()
        self.coalesced = 0  # steps replaced before they were read

    def put(self, item: Output | InferenceResult) -> None:
        if isinstance(item, Output) and self._items and isinstance(self._items[-1], Output):
            unread = self._items[-1]
            if item.preview is None and unread.preview is not None:
                item = dataclasses.replace(item, preview=unread.preview)
            self._items[-1] = item
            self.coalesced += 1
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> Output | InferenceResult:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

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
  fit the batch (``max_images``) and the device's memory (``MemoryRoom``), its LoRA adapter at one scale.
- **Who waits,** how many are ahead and, through ``plan_until``, which batches run before it (the
  ETA), all from the same state and the same rules.

A joinable batch hands each entry to the model side as its own job, tagged with the batch's
``loop_id``; the model thread admits what is tagged for its running loop and decides nothing (an
entry sent a step early, for the place of members on their last step, names them in
``enters_after``). A closed batch (no step-level loop for this model, or joining off) enters all at
step 0 and runs as one whole-pipeline call. ``jobs.GpuJobs`` runs both.

Owner: the event loop. Nothing here holds a lock; other threads reach it through the loop.
"""

from __future__ import annotations

import contextvars
import itertools
from dataclasses import dataclass, field
from typing import Hashable

from ..protocol import InferenceJob, InferenceResult
from ..request import GenerateRequest
from .events import Step
from .line import End, StopSignal, WaitLine
from .mailbox import Mailbox

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

    def deliver(self, item: Step | End) -> None:
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
    scheduler and LoRA adapter (at one scale), and a negative prompt on all or none (SDXL zeroes an
    all-empty one; one empty among others is encoded as "")."""
    r = request
    return (r.width, r.height, r.num_inference_steps, r.guidance_scale, bool(r.negative_prompt), r.scheduler,
            r.lora_use)  # fmt: skip


def loop_key(request: GenerateRequest, mixed_loras: bool) -> tuple[Hashable, ...]:
    """Requests with equal keys can share a step-level loop: the same size and sampler (they may
    differ in prompt, seed, image count, steps and guidance), and the same LoRA adapter and scale
    unless the model mixes adapters per row (then ``Batch.admits`` keeps one scale each)."""
    r = request
    return (r.width, r.height, r.scheduler) if mixed_loras else (r.width, r.height, r.scheduler, r.lora_use)


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
        """Whether ``entry``'s LoRA adapter can share this batch's calls: each adapter at one scale."""
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

    def leaving(self) -> tuple[str, ...]:
        """The request ids of the entries on their last step (a joiner sent now enters after them)."""
        return tuple(e.request.request_id for e in self.entries if e.last_step)


def call_job(entries: list[Entry]) -> InferenceJob:
    """One whole-pipeline call for the entries of a closed batch (they share ``batch_key``)."""
    jobs = [e.request.to_job() for e in entries]
    offsets = image_offsets(entries)
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
    """

    def __init__(self) -> None:
        self.total: int | None = None
        self.base: int | None = None
        self.per_pixel = 0.0

    def learn(self, width: int, height: int, images: int, result: InferenceResult) -> None:
        total, base, peak = result.device_total_bytes, result.idle_bytes, result.peak_memory_bytes
        if total is None or base is None or peak is None or images < 1:
            return
        self.total, self.base = total, base
        self.per_pixel = max(self.per_pixel, max(0, peak - base) / (images * width * height))

    def fits(self, width: int, height: int, loop_images: int, images: int) -> bool:
        if self.total is None or self.base is None or not self.per_pixel:
            return True
        return self.base + self.per_pixel * (loop_images + images) * width * height <= HEADROOM * self.total


@dataclass(frozen=True)
class Join:
    """An entry that enters the running batch now, after the entries named in ``after`` have left."""

    entry: Entry
    after: tuple[str, ...] = ()


class Scheduler:
    """The fair line, the running batch and every decision about them (see the module docstring)."""

    def __init__(self, max_images: int, *, joining: bool, mixed_loras: bool, line: WaitLine[Entry]) -> None:
        self.max_images = max_images
        self.joining = joining  # step-level loops on the model side
        self.mixed_loras = mixed_loras  # the model's loops take entries with different LoRA adapters
        self.line = line
        self.running: Batch | None = None
        self.memory = MemoryRoom()

    # -- the line --------------------------------------------------------------------------------
    def add(self, entry: Entry) -> None:
        entry.ticket = self.line.join(entry, entry.user)
        self.line.notify()  # the gate may be free, or a running loop may take it at its next step

    def leave(self, entry: Entry) -> None:
        self.line.leave(entry.ticket)

    def waiting(self, user: Hashable) -> int:
        return self.line.waiting(user)

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

    def ended(self, batch: Batch) -> None:
        """The batch's last entry has left and the model side is done with it: the gate opens."""
        if self.running is batch:
            self.running = None
        self.line.notify()

    def _compose(self, head: Entry, fair: list[Entry], *, take: bool) -> Batch:
        """The batch ``head`` opens with the entries behind it in ``fair`` that share it now."""
        if self.joining:
            batch = Batch(loop_key(head.request, self.mixed_loras), True, self.max_images)
            self._enter(batch, head, take)
            if take:
                self.line.served([head.user] if head.user is not None else [])
                self.line.notify()
            self._joiners(batch, fair[1:] if fair and fair[0] is head else fair, take=take)
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
            if loop_key(r, self.mixed_loras) != batch.key or not batch.admits(entry):
                break
            if not self.fits(staying, entry):
                break
            if not self.memory.fits(r.width, r.height, staying, entry.images):
                break
            # Room now, or a step early: the place of the entries on their last step.
            after = () if self.fits(images, entry) else batch.leaving()
            staying += entry.images
            images += entry.images
            self._enter(batch, entry, take)
            joins.append(Join(entry, after))
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

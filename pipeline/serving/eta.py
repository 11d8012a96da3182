"""How long a request will take: estimates from measured rates, kept per shape. No torch.

Every finished job is measured on the event loop's clock, in three parts:

- **per step**: (arrival of the last step - arrival of the first) / (steps - 1), kept as a *rate* in
  pixel-steps per second (width x height x images, per step), so that one measured shape also
  informs the others;
- **head**: from the job's start to its first step, less that step (prompt encoding, the hop to
  the model side): a fixed per-job overhead;
- **tail**: from the last step to the result (the VAE decode, the hop back).

Each part is a running mean (EWMA; the newest job weighs ``ALPHA``) kept for the job's shape (width x
height, steps, images) and over all jobs. An estimate takes the shape's own means once that shape
has run, else the global rate scaled to the shape's pixel-steps plus the global head and tail; before
the first measurement there is no estimate (None). ``JobClock`` follows the running job: its time
left is the steps left x its own measured step time (the shape's, until two steps have run), plus
the expected tail.

Owner: the event loop (``GpuJobs`` records and reads; the adapter reads for its line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.3  # weight of the newest job in every running mean
MAX_SHAPES = 256  # shapes remembered (the oldest is forgotten first)


@dataclass(frozen=True)
class Shape:
    """What a job's duration depends on: pixels per image, denoising steps, images."""

    pixels: int
    steps: int
    images: int

    @property
    def pixels_per_step(self) -> int:
        return self.pixels * self.images


@dataclass
class Mean:
    """An exponentially weighted running mean; None until the first value."""

    value: float | None = None

    def add(self, x: float, alpha: float = ALPHA) -> None:
        self.value = x if self.value is None else self.value + alpha * (x - self.value)


@dataclass
class Rates:
    """Running means of one shape's (or all jobs') rate, head and tail."""

    rate: Mean = field(default_factory=Mean)  # pixel-steps per second
    head: Mean = field(default_factory=Mean)  # seconds before the first step, besides the step itself
    tail: Mean = field(default_factory=Mean)  # seconds after the last step

    def add(self, rate: float | None, head: float | None, tail: float, alpha: float) -> None:
        if rate is not None:
            self.rate.add(rate, alpha)
        if head is not None:
            self.head.add(head, alpha)
        self.tail.add(tail, alpha)


class EtaBook:
    """Measured rates per shape, with the global rate as the fallback."""

    def __init__(self, alpha: float = ALPHA, max_shapes: int = MAX_SHAPES) -> None:
        self.alpha = alpha
        self.max_shapes = max_shapes
        self.all = Rates()
        self.shapes: dict[Shape, Rates] = {}

    def record(self, shape: Shape, head: float, step: float | None, tail: float) -> None:
        """One finished job: its head, its step time (None: a 1-step job, head and step together), tail."""
        if step is None:  # one step: split off the head we expect, the rest was the step
            expected = self._part(shape, "head") or 0.0
            step, head_seen = max(head - expected, 1e-6), None
        else:
            head_seen = max(head, 0.0)
        rate = shape.pixels_per_step / max(step, 1e-6)
        own = self.shapes.pop(shape, None) or Rates()
        own.add(rate, head_seen, max(tail, 0.0), self.alpha)
        self.shapes[shape] = own  # the most recently run shape is the last forgotten
        while len(self.shapes) > self.max_shapes:
            del self.shapes[next(iter(self.shapes))]
        self.all.add(rate, head_seen, max(tail, 0.0), self.alpha)

    def _part(self, shape: Shape, part: str) -> float | None:
        own = self.shapes.get(shape)
        value = getattr(own, part).value if own is not None else None
        return value if value is not None else getattr(self.all, part).value

    def step_seconds(self, shape: Shape) -> float | None:
        rate = self._part(shape, "rate")
        return None if rate is None else shape.pixels_per_step / rate

    def tail_seconds(self, shape: Shape) -> float:
        return self._part(shape, "tail") or 0.0

    def job_seconds(self, shape: Shape) -> float | None:
        """A whole job of this shape, from its start to its result; None before any measurement."""
        step = self.step_seconds(shape)
        if step is None:
            return None
        return (self._part(shape, "head") or 0.0) + shape.steps * step + self.tail_seconds(shape)


class JobClock:
    """One job on the model side, followed on the loop's clock: when it started and its steps arrived."""

    def __init__(self, shape: Shape, now: float) -> None:
        self.shape = shape
        self.started = now
        self.total = shape.steps
        self.step = 0
        self.first: float | None = None  # when step 1 arrived
        self.last: float | None = None  # when the latest step arrived

    def on_step(self, step: int, total: int, now: float) -> None:
        if self.first is None:
            self.first = now
        self.step, self.total, self.last = step, total, now

    def measured_step(self) -> float | None:
        """This job's own seconds per step, once two steps have arrived."""
        if self.first is None or self.last is None or self.step < 2:
            return None
        return (self.last - self.first) / (self.step - 1)

    def remaining(self, book: EtaBook, now: float) -> float | None:
        """Seconds until this job's result: steps left x step time, plus the tail; None if nothing is known."""
        step = self.measured_step() or book.step_seconds(self.shape)
        if step is None:
            return None
        tail = book.tail_seconds(self.shape)
        if self.last is None:  # no step yet: the whole job, less the time it has already had
            whole = book.job_seconds(self.shape) or self.total * step + tail
            return max(whole - (now - self.started), tail)
        return max(0.0, (self.total - self.step) * step - (now - self.last)) + tail

    def finish(self, book: EtaBook, now: float) -> None:
        """The job's result arrived: record what it measured."""
        if self.first is None or self.last is None:
            return  # no step was seen (a model side that reports none): nothing to split
        step = self.measured_step()
        head = self.first - self.started - (step or 0.0)
        if step is None:  # one step: the head and the step together
            head = self.first - self.started
        book.record(self.shape, head, step, now - self.last)

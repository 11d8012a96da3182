"""Step caching that stays per request inside shared loops (issue 50).

diffusers' cache hooks keep one state per module for the whole batch: rows that joined at other steps
would share another request's phase, residuals and skip decision, and the same seed would draw other
pixels under other load. Here the cache lives with the loop member (``LoopMember.cache``) and leaves
with it: each member decides from its own step index, on its own denoiser outputs only, so a
request's picture never depends on who shared its steps.

**Schedule-based methods** (every family with a step-level loop). A member computes its first
``warmup`` steps and its last ``tail``, and one step in ``interval`` between; on the others it
leaves the step's denoiser call (the batch shrinks) and its sampler steps with a prediction made
from its own last outputs:

- ``taylorseer``: TaylorSeer's first-order extrapolation, ``y₂ + (y₂ - y₁)·(k - k₂)/(k₂ - k₁)`` from
  the member's last two computed outputs (at its steps k₁ < k₂), interval 3;
- ``reuse``: the last computed output again (FORA's and DeepCache's reuse, at the output), interval 2.

**Data-dependent, per row** (``fbcache``: First-Block Cache; FLUX.1's, Chroma's, Qwen-Image's, Z-Image's loops):
every row runs the transformer's first block; a row whose first-block residual changed by less than ``threshold``
(mean |r - r_prev| / mean |r_prev|, against its own residual at its own last computed step) skips the
remaining blocks and adds its own cached residual of them; the rows that miss run the remaining
blocks together (``index_select``) and keep their new residuals. Rows of members with another method
or none always run them (``RowCache``; ``loop_flow.flux_rows``, ``chroma_rows``,
``z_image_rows``, ``loop_qwen.qwen_rows``).

The output is what the loop's ``_predict`` returns for the member: its guided prediction (after
classifier-free guidance), the tensor its sampler steps with. A member's steps count from its own
first step (image-to-image: the shortened schedule's first). ``"auto"`` is the model's recommended
method (``ModelProfile.step_caches[0]``), chosen from the embedded model's measured quality.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Schedule:
    """Which of a member's steps its denoiser computes, and how the others are predicted."""

    warmup: int  # the first steps, always computed
    interval: int  # after the warm-up: one step in this many computed
    order: int  # 0: the last output again; 1: first-order extrapolation from the last two
    tail: int = 1  # the last steps, always computed (the final denoise sets the picture's detail)

    def computes(self, step: int, total: int) -> bool:
        return step < self.warmup or step >= total - self.tail or (step - self.warmup) % self.interval == 0

    def evaluations(self, total: int) -> int:
        """The denoiser evaluations a member of ``total`` steps computes."""
        return sum(self.computes(k, total) for k in range(total))


# The methods, by ``fields.STEP_CACHE_METHODS``' names ("auto"'s first: docs/performance.md#step-caching).
METHODS: dict[str, Schedule] = {
    "taylorseer": Schedule(warmup=3, interval=3, order=1),
    "reuse": Schedule(warmup=2, interval=2, order=0),
}
ROW_METHODS: dict[str, float] = {"fbcache": 0.08}  # First-Block Cache: its threshold (ParaAttention's FLUX figure)


@dataclass
class MemberCache:
    """One member's cache: its outputs at its computed steps (the last two), its counts."""

    method: str
    schedule: Schedule
    total: int
    computed: int = 0
    skipped: int = 0
    _outputs: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def of(cls, method: str, total: int, rows: int = 1) -> MemberCache | RowCache | None:
        """The cache of a member with ``total`` steps (and ``rows`` denoiser rows), or None where
        ``method`` is off."""
        if method in ROW_METHODS:
            return RowCache(method, ROW_METHODS[method], rows)
        schedule = METHODS.get(method)
        return cls(method, schedule, total) if schedule is not None else None

    def computes(self, step: int) -> bool:
        # a prediction needs ``order + 1`` computed outputs: before that, the step is computed
        return len(self._outputs) <= self.schedule.order or self.schedule.computes(step, self.total)

    def record(self, step: int, output: torch.Tensor) -> None:
        self.computed += 1
        self._outputs = [*self._outputs[-1:], (step, output)]

    def predict(self, step: int) -> torch.Tensor:
        self.skipped += 1
        (k2, y2) = self._outputs[-1]
        if self.schedule.order == 0 or len(self._outputs) < 2:
            return y2
        (k1, y1) = self._outputs[-2]
        return y2 + (y2 - y1) * ((step - k2) / (k2 - k1))

    def report(self) -> tuple[tuple[str, object], ...]:
        """What the info record says: the method and the evaluations computed and skipped."""
        return (("method", self.method), ("computed", self.computed), ("skipped", self.skipped))


@dataclass
class RowCache:
    """First-Block Cache for one member's rows: each row's first-block residual at its last computed
    step and its residual of the remaining blocks there. The member computes every step at the loop's
    level (``computes``); its family's forward asks ``hits`` and ``keep`` per step."""

    method: str
    threshold: float
    rows: int
    computed: int = 0  # row-steps whose remaining blocks ran
    skipped: int = 0  # row-steps served from the cached residual
    _first: torch.Tensor | None = None
    _rest: torch.Tensor | None = None

    def computes(self, step: int) -> bool:
        return True

    def record(self, step: int, output: torch.Tensor) -> None:
        """Nothing at the loop's level: its rows decide inside the forward."""

    def predict(self, step: int) -> torch.Tensor:
        raise AssertionError("a row cache computes every step at the loop's level")

    def hits(self, first: torch.Tensor) -> torch.Tensor:
        """Which of its rows skip the remaining blocks, from their first-block residual ``first``: its
        first ``len(first)`` rows (Z-Image's guidance rows leave the call once its CFG is truncated)."""
        if self._first is None or first.shape[0] > self._first.shape[0]:
            return torch.zeros(first.shape[0], dtype=torch.bool, device=first.device)
        dims, before = tuple(range(1, first.ndim)), self._first[: first.shape[0]]
        change = (first - before).abs().mean(dims) / before.abs().mean(dims).clamp_min(1e-12)
        return change < self.threshold

    def keep(self, hits: torch.Tensor, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        """After the step: the rows that missed keep ``first`` and ``rest`` (their remaining blocks'
        residual); the rows that hit get their cached ``rest``. Returns each row's residual to add."""
        miss = ~hits
        if self._first is None or self._rest is None or first.shape[0] > self._first.shape[0]:
            self._first, self._rest = first.clone(), rest.clone()
        else:
            rows = first.shape[0]
            self._first[:rows][miss], self._rest[:rows][miss] = first[miss], rest[miss]
        self.skipped += int(hits.sum())
        self.computed += int(miss.sum())
        return torch.where(hits.reshape(-1, *[1] * (rest.ndim - 1)), self._rest[: rest.shape[0]], rest)

    def report(self) -> tuple[tuple[str, object], ...]:
        """The method and its row-steps (per image): remaining blocks computed and skipped."""
        return (("method", self.method), ("computed", self.computed), ("skipped", self.skipped))

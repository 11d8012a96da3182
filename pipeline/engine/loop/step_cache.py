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

The output is what the loop's ``_predict`` returns for the member: its guided prediction (after
classifier-free guidance), the tensor its sampler steps with. A member's steps count from its own
first step (image-to-image: the shortened schedule's first). ``"auto"`` is the model's recommended
method (``ModelProfile.step_caches[0]``), chosen from the embedded model's measured quality.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...fields import STEP_CACHE_OFF


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
OFF = STEP_CACHE_OFF


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
    def of(cls, method: str, total: int) -> MemberCache | None:
        """The cache of a member with ``total`` steps, or None where ``method`` is off."""
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

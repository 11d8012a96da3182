"""Whether a request fits beside a running loop, from the device memory the jobs so far have used.

A joiner that would not fit beside a running step-level loop must wait for the next loop instead of
entering and failing everyone in it with an out-of-memory error. The figure is measured, not
guessed: after each job, the device's peak memory above the idle footprint (the weights), per image
and per pixel at that job's size (``peak - base) / (images * width * height)``, the largest seen so
far. A joiner fits while ``base + per_pixel * (images in the loop + its images) * width * height``
stays under ``HEADROOM`` of the device's memory. Until a job has been measured, and on a device
that reports no memory (the CPU), everything fits, as before. Owned by the model thread.
"""

from __future__ import annotations

from typing import Callable

HEADROOM = 0.9  # of the device's total memory: the allocator's fragmentation and the decode's extra


class RowMemory:
    """The learned peak per image pixel, and the admission check it gives (see the module doc)."""

    def __init__(self, probe: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.probe = probe  # () -> (the device's total bytes, bytes allocated now); None: not a GPU
        self.per_pixel = 0.0  # peak bytes above the idle footprint, per image and pixel
        self.base: int | None = None  # bytes allocated with no job running (the weights)

    def idle(self) -> None:
        """Note the footprint with no job running (called before a loop opens)."""
        reading = self.probe() if self.probe is not None else None
        if reading is not None:
            self.base = reading[1]

    def learn(self, width: int, height: int, images: int, peak: int | None) -> None:
        if peak is None or self.base is None or images < 1:
            return
        self.per_pixel = max(self.per_pixel, max(0, peak - self.base) / (images * width * height))

    def fits(self, width: int, height: int, loop_images: int, job_images: int) -> bool:
        reading = self.probe() if self.probe is not None else None
        if reading is None or self.base is None or not self.per_pixel:
            return True
        need = self.base + self.per_pixel * (loop_images + job_images) * width * height
        return need <= HEADROOM * reading[0]

"""The device's memory as the model side reads it, reported with every result.

A joiner that would not fit beside a running step-level loop must wait for the next loop instead of
entering and failing everyone in it with an out-of-memory error. The serving side's scheduler
decides that (``serving.scheduler.MemoryRoom``) from what the model side measures: the device's
total memory, the footprint with no job running (the weights), read before each loop or call opens,
and each job's peak. This module only reads and reports; on a device that reports no memory (the
CPU) it reports nothing. Owned by the model thread.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ...protocol import InferenceResult


class DeviceMemory:
    """The device's total and idle bytes, stamped on each result (see the module doc)."""

    def __init__(self, probe: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.probe = probe  # () -> (the device's total bytes, bytes allocated now); None: not a GPU
        self.total: int | None = None
        self.base: int | None = None  # bytes allocated with no job running (the weights)

    def idle(self) -> None:
        """Note the footprint with no job running (called before a loop or a call opens)."""
        reading = self.probe() if self.probe is not None else None
        if reading is not None:
            self.total, self.base = reading

    def stamp(self, result: InferenceResult) -> InferenceResult:
        if self.total is None or self.base is None:
            return result
        return dataclasses.replace(result, device_total_bytes=self.total, idle_bytes=self.base)

"""What a request's stream yields to its caller, and the record of when each stage ran."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..protocol import EncodedPreview


@dataclass(frozen=True)
class Waiting:
    """Prepared and in line for the GPU; ``ahead`` jobs (the running one included) come first.

    ``eta_seconds``: the estimated time until this request's images (the running job's time left,
    each job ahead, then its own), from measured rates (``eta.py``); None until a job has been measured.
    """

    ahead: int
    eta_seconds: float | None = None


@dataclass(frozen=True)
class Step:
    """Step ``step`` of ``total`` has run; ``eta_seconds``: the job's estimated time left (None: not known yet)."""

    step: int
    total: int
    preview: EncodedPreview | None = None
    eta_seconds: float | None = None


@dataclass(frozen=True)
class Done:
    paths: list[Path]
    info: dict[str, Any]


Event = Waiting | Step | Done


@dataclass
class Timings:
    """Wall-clock times (``time.time()``) of one request's stages, written by its orchestrator."""

    received: float = 0.0
    prepare_start: float = 0.0
    prepare_end: float = 0.0
    gpu_wait_start: float = 0.0
    infer_start: float = 0.0
    infer_end: float = 0.0
    finalize_start: float = 0.0
    finalize_end: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def durations_ms(self) -> dict[str, float]:
        def ms(a: float, b: float) -> float:
            return round((b - a) * 1000, 3)

        return {
            "prepare": ms(self.prepare_start, self.prepare_end),
            "gpu_wait": ms(self.gpu_wait_start, self.infer_start),
            "inference": ms(self.infer_start, self.infer_end),
            "finalize": ms(self.finalize_start, self.finalize_end),
            "total": ms(self.received, self.finalize_end),
        }

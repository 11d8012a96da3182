"""The messages on the model process's socket pair: one frozen dataclass each, pickled whole. Free of torch.

Server -> model process: ``RunJob`` (a job under its serial), ``StopJob`` (that job's stop, the
moment the server's stop is set), ``CountTokens`` (a prompt to measure), ``Shutdown``.

Model process -> server: ``Ready`` (the loaded model's profile) or ``LoadFailed`` (why not), then
``JobEvent`` for every event of every job in flight (a cancelled job's end carries the model's own
step count when its stop reached it, ``InferenceResult.steps_at_stop``), ``TokenCounts`` (a count's answer).

``engine.hosting.process`` sends and reads the server's side, ``engine.hosting.child`` the model process's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...protocol import InferenceJob, ModelEvent, ModelProfile

EXIT_POISONED = 75  # the model process's exit code after a device fault poisoned it (``engine.device_faults``)


@dataclass(frozen=True)
class RunJob:
    serial: int
    job: InferenceJob


@dataclass(frozen=True)
class StopJob:
    serial: int


@dataclass(frozen=True)
class CountTokens:
    key: int
    text: str
    model: str = ""  # several models (issue 52): whose encoders; "": the default


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    profile: ModelProfile


@dataclass(frozen=True)
class LoadFailed:
    message: str


@dataclass(frozen=True)
class JobEvent:
    serial: int
    event: ModelEvent


@dataclass(frozen=True)
class TokenCounts:
    key: int
    counts: Mapping[str, int] | None  # None: counting failed (logged in the model process)


ToModel = RunJob | StopJob | CountTokens | Shutdown
ToServer = Ready | LoadFailed | JobEvent | TokenCounts

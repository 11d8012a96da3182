"""The open-loop benchmark's pure figures: Poisson schedules, percentiles, latency summaries, the
ABBA order of designs, and what one run's requests add up to (``bench.openloop`` measures them)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any, Sequence


def poisson_schedule(rate: float, n: int, seed: int, exact: bool = False) -> list[float]:
    """``n`` send times (seconds from the start) of a Poisson process of ``rate`` per second: the first
    at 0, then seeded exponential gaps of mean ``1 / rate``. The same seed gives the same schedule.

    ``exact``: the gaps scaled so that the schedule's own mean rate, ``(n - 1) / last``, is ``rate``
    exactly: the process conditioned on its last arrival at ``(n - 1) / rate`` (its arrivals are then
    sorted uniform times, still Poisson in shape). A short run of 24 draws otherwise offers anywhere
    from about 0.7 to 1.5 times the nominal rate, and the loads would compare draws, not loads.
    """
    if rate <= 0 or n < 1:
        raise ValueError("rate must be > 0 and n >= 1")
    rng = random.Random(seed)
    times, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.expovariate(rate)
        times.append(t)
    if exact and n > 1:
        scale = (n - 1) / rate / times[-1]
        times = [x * scale for x in times]
    return times


def schedule_rate(schedule: Sequence[float]) -> float | None:
    """A schedule's own mean rate: its gaps over its length (None for fewer than two sends)."""
    return (len(schedule) - 1) / schedule[-1] if len(schedule) > 1 and schedule[-1] > 0 else None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 / mean / max / n of latencies in ms (an empty dict for none)."""
    if not values_ms:
        return {}
    return {
        "p50": percentile(values_ms, 50),
        "p95": percentile(values_ms, 95),
        "p99": percentile(values_ms, 99),
        "mean": statistics.fmean(values_ms),
        "max": max(values_ms),
        "n": float(len(values_ms)),
    }


def orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The designs' order in each round: forwards, then backwards, ... (a steady drift favours none)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


@dataclasses.dataclass
class Shot:
    """One request of an open-loop run: when it was due, sent and answered (``time.monotonic()``)."""

    scheduled: float
    sent: float
    finished: float
    ok: bool
    images: int
    info: dict[str, Any] | None
    error: str | None = None


def open_loop_summary(shots: Sequence[Shot], offered: float | None = None) -> dict[str, Any]:
    """Latency from each request's scheduled submit to its answer (a late send counts against the
    server's side, as in any open-loop measure), the achieved rate (images over the first scheduled
    submit to the last answer), the client's worst send lag, the batches seen, and errors."""
    good = [s for s in shots if s.ok]
    span = max(s.finished for s in shots) - min(s.scheduled for s in shots) if shots else 0.0
    images = sum(s.images for s in good)
    sizes = [int(s.info["batch_size"]) for s in good if s.info and s.info.get("batch_size") is not None]
    return {
        "requests": len(shots),
        "errors": len(shots) - len(good),
        "error_messages": [str(s.error) for s in shots if not s.ok][:3],
        "offered_images_per_second": offered,
        "achieved_images_per_second": images / span if span > 0 else 0.0,
        "latency_ms": latency_summary([(s.finished - s.scheduled) * 1000 for s in good]),
        "send_lag_ms_max": max(((s.sent - s.scheduled) * 1000 for s in shots), default=0.0),
        "mean_batch_size": statistics.fmean(sizes) if sizes else None,
        # from the records' "batching" / "joined_at_step" where the server writes them: requests served
        # by a step-level loop, and those that entered one already running (joined after step 0)
        "in_step_loop": sum(1 for s in good if s.info and s.info.get("batching") == "step"),
        "joined_running_loop": sum(1 for s in good if s.info and (s.info.get("joined_at_step") or 0) > 0),
    }


def late_figures(long_info: dict[str, Any], late_info: dict[str, Any], long_steps: int) -> dict[str, Any]:
    """The late request's wait before its first step against one step of the running job."""
    step_ms = long_info["durations_ms"]["inference"] / long_steps
    wait_ms = late_info["durations_ms"]["gpu_wait"]
    arrived = (late_info["timings"]["gpu_wait_start"] - long_info["timings"]["infer_start"]) * 1000
    return {
        "step_ms": step_ms,
        "wait_ms": wait_ms,
        "wait_over_step": wait_ms / step_ms if step_ms > 0 else None,
        "arrived_at_step": arrived / step_ms if step_ms > 0 else None,
        "late_batch_size": late_info.get("batch_size"),
        "batching": late_info.get("batching"),
        "joined_at_step": late_info.get("joined_at_step"),
    }

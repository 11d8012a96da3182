"""The fair-share benchmark's counting (``bench/fairness.py``), on made-up info records."""

from __future__ import annotations

from typing import Any

from bench.fairness import jobs_before, render, waiting_at


def info(ready: float, entered: float) -> dict[str, Any]:
    return {"timings": {"gpu_wait_start": ready, "infer_start": entered}}


def test_jobs_before_counts_only_entries_between_ready_and_entered() -> None:
    light = info(10.0, 12.0)
    others = [info(0.0, 9.0), info(1.0, 10.5), info(2.0, 11.9), info(3.0, 12.5), info(11.0, 13.0)]
    assert jobs_before(light, others) == 2
    assert waiting_at(10.0, others) == 3  # not the one in at 9.0, nor the one that arrives at 11.0
    assert waiting_at(11.0, others) == 3  # one entered at 10.5, one arrived at 11.0


def test_the_report_names_every_light_request() -> None:
    row = {
        "request_id": "abcdef123",
        "jobs_before": 1,
        "heavy_waiting_at_arrival": 40,
        "other_active_users": 1,
        "gpu_wait_ms": 12.0,
        "total_ms": 99.0,
        "batching": "step",
    }
    text = render(
        {
            "heavy": 50,
            "light": 1,
            "steps": 8,
            "step_ms_median": 10.0,
            "light_requests": [row],
            "heavy_total_ms_p50": 1.0,
            "heavy_total_ms_max": 2.0,
        }
    )
    assert "| abcdef12 | 1 | 1 | 40 | 12 | 99 |" in text

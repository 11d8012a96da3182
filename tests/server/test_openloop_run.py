"""One small run of the open-loop batching benchmark (``bench.openloop``) against a real app on a fast
simulated device: every figure present and finite, no timing thresholds (its schedule and summaries on
known inputs are in ``tests/unit/test_openloop.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import openloop
from bench.report import finite_figures

FAST_SIM = "sim:cpu_ms=1,dev_ms=3,decode_ms=1,size=64,steps=2"


TINY = openloop.Plan(
    capacity_clients=2,
    capacity_requests=6,
    capacity_rounds=1,
    loads=(0.5, 0.9),
    open_requests=6,
    burst=3,
    burst_rounds=1,
    late_steps=8,
    late_after=2,
    late_rounds=1,
    rss_full=8,
)


def test_a_small_run_has_every_figure(tmp_path: Path) -> None:
    (model,) = openloop.models_for(FAST_SIM, quick=True)
    section = openloop.run_section(model, TINY, tmp_path, designs=("none",))
    result = {"quick": True, "cores": 2, "plan": {}, "sections": [section], "seconds": section["seconds"]}
    assert finite_figures(result)
    assert openloop.errors_of(result) == 0

    cap = section["capacity"]["none"]
    assert cap["images_per_second"] > 0 and section["rate_100_images_per_second"] == cap["images_per_second"]
    assert set(section["open_loop"]) == {"50%", "90%"}
    for point in section["open_loop"].values():
        assert point["schedule_rate_per_second"] == pytest.approx(point["rate_per_second"])
        row = point["none"]
        assert row["requests"] == 6 and row["achieved_images_per_second"] > 0
        assert {"p50", "p95", "p99"} <= set(row["latency_ms"])
        assert all(math.isfinite(v) for v in row["latency_ms"].values())
    burst = section["burst"]
    assert burst["sequential_on_none_s"] > 0 and burst["none"]["makespan_s"] > 0
    assert math.isfinite(burst["none"]["over_sequential"])
    # the raw reference ran the same 3 one by one and as one batch: the sim's batch costs 1 + 0.6 (b - 1)
    assert burst["raw"]["batch"] == openloop.BATCH and burst["raw"]["gain"] > 1.1
    assert burst["none"]["gain_over_raw_gain"] == pytest.approx(
        burst["sequential_on_none_s"] / burst["none"]["makespan_s"] / burst["raw"]["gain"]
    )
    late = section["late"]["none"]
    for key in ("step_ms", "wait_ms", "wait_over_step", "arrived_at_step", "late_latency_ms"):
        assert late[key] is not None and math.isfinite(late[key]), key
    memory = section["memory"]["none"]
    assert memory["rss_batch_mb"] > 0 and memory["rss_full_mb"] > 0 and math.isfinite(memory["full_over_batch"])

    table = openloop.render(result)
    assert "| none |" in table and "nan" not in table.lower()

"""The open-loop batching benchmark (``bench.openloop``) and its figures (``bench.stats``) on known inputs
(one small run against a real app is in ``tests/server/test_openloop_run.py``). No timing thresholds."""

from __future__ import annotations

import statistics

import pytest

from bench import openloop, stats
from bench.stats import Shot

# --- the Poisson schedule ------------------------------------------------------------------------------


def test_the_schedule_is_seeded() -> None:
    a = stats.poisson_schedule(4.0, 50, seed=7)
    assert a == stats.poisson_schedule(4.0, 50, seed=7)
    assert a != stats.poisson_schedule(4.0, 50, seed=8)
    assert len(a) == 50 and a[0] == 0.0
    assert all(x < y for x, y in zip(a, a[1:]))


def test_the_schedule_has_the_asked_mean_rate() -> None:
    rate, n = 5.0, 20_000
    times = stats.poisson_schedule(rate, n, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert stats.schedule_rate(times) == pytest.approx(rate, rel=0.03)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # exponential gaps: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / rate, rel=0.05)


def test_an_exact_schedule_keeps_the_draws_shape_at_the_nominal_rate() -> None:
    drawn = stats.poisson_schedule(3.0, 24, seed=19)
    exact = stats.poisson_schedule(3.0, 24, seed=19, exact=True)
    assert stats.schedule_rate(exact) == pytest.approx(3.0)
    assert exact[-1] == pytest.approx(23 / 3.0)
    scale = exact[-1] / drawn[-1]
    assert exact == pytest.approx([x * scale for x in drawn])
    assert stats.poisson_schedule(3.0, 1, seed=19, exact=True) == [0.0]


def test_the_schedule_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        stats.poisson_schedule(0.0, 10, seed=1)
    with pytest.raises(ValueError):
        stats.poisson_schedule(1.0, 0, seed=1)
    assert stats.schedule_rate([0.0]) is None


# --- percentiles and summaries -------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 50) == 3.0
    assert stats.percentile(values, 95) == pytest.approx(4.8)
    assert stats.percentile(values, 99) == pytest.approx(4.96)
    assert stats.percentile(values, 100) == 5.0
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile(list(range(101)), 99) == 99
    with pytest.raises(ValueError):
        stats.percentile([], 50)


def test_latency_summary() -> None:
    s = stats.latency_summary([float(v) for v in range(1, 101)])
    assert s["p50"] == pytest.approx(50.5)
    assert s["p95"] == pytest.approx(95.05)
    assert s["p99"] == pytest.approx(99.01)
    assert s["mean"] == pytest.approx(50.5) and s["max"] == 100 and s["n"] == 100
    assert stats.latency_summary([]) == {}


def test_open_loop_summary_measures_from_the_scheduled_send() -> None:
    shots = [
        Shot(scheduled=10.0, sent=10.001, finished=10.5, ok=True, images=1, info={"batch_size": 1}),
        Shot(
            scheduled=10.2,
            sent=10.204,
            finished=11.2,
            ok=True,
            images=1,
            info={"batch_size": 2, "batching": "step", "joined_at_step": 0},
        ),
        Shot(
            scheduled=10.4,
            sent=10.402,
            finished=11.2,
            ok=True,
            images=1,
            info={"batch_size": 2, "batching": "step", "joined_at_step": 3},
        ),
        Shot(scheduled=10.6, sent=10.6, finished=12.0, ok=False, images=0, info=None, error="boom"),
    ]
    s = stats.open_loop_summary(shots, offered=5.0)
    assert s["requests"] == 4 and s["errors"] == 1 and s["error_messages"] == ["boom"]
    assert s["offered_images_per_second"] == 5.0
    # 3 images from the first scheduled send (10.0) to the last answer (12.0, the failed one's)
    assert s["achieved_images_per_second"] == pytest.approx(3 / 2.0)
    assert s["latency_ms"]["p50"] == pytest.approx(800.0)
    assert s["latency_ms"]["max"] == pytest.approx(1000.0)
    assert s["latency_ms"]["n"] == 3
    assert s["send_lag_ms_max"] == pytest.approx(4.0)
    assert s["mean_batch_size"] == pytest.approx(5 / 3)
    assert s["in_step_loop"] == 2 and s["joined_running_loop"] == 1


def test_late_figures_count_in_steps_of_the_running_job() -> None:
    long_info = {
        "durations_ms": {"inference": 400.0, "gpu_wait": 0.0},
        "timings": {"infer_start": 100.0, "gpu_wait_start": 100.0},
    }
    late_info = {
        "durations_ms": {"inference": 420.0, "gpu_wait": 340.0},
        "timings": {"infer_start": 100.4, "gpu_wait_start": 100.06},
        "batch_size": 1,
    }
    f = stats.late_figures(long_info, late_info, 20)
    assert f["step_ms"] == pytest.approx(20.0)
    assert f["wait_ms"] == 340.0 and f["wait_over_step"] == pytest.approx(17.0)
    assert f["arrived_at_step"] == pytest.approx(3.0)
    assert f["batching"] is None and f["joined_at_step"] is None  # absent from older records: .get
    joined = stats.late_figures(long_info, {**late_info, "batching": "step", "joined_at_step": 4}, 20)
    assert joined["batching"] == "step" and joined["joined_at_step"] == 4


def test_the_designs_alternate_so_that_drift_favours_none() -> None:
    assert stats.orders(["none", "job", "step"], 3) == [
        ["none", "job", "step"],
        ["step", "job", "none"],
        ["none", "job", "step"],
    ]
    assert openloop.DEFAULT_DESIGNS == ("none", "job", "step")
    assert set(openloop.DESIGNS) == {"none", "job", "step", "cache", "lock"}  # the last two on request
    for flags in openloop.DESIGNS.values():
        assert "--max-batch-size" in flags and "--step-joining" in flags
    assert openloop.DESIGNS["cache"][-2:] == ("--step-cache", "auto")
    assert openloop.SERVER_DESIGN == {"lock": "whole_lock"}  # bench.servers' one lock around the handler


def test_the_sections() -> None:
    both = openloop.models_for(None, quick=True)
    assert [m.name for m in both] == ["default", "sim"]
    assert both[0].spec is None and both[0].flags() == () and both[0].size == 64 and both[0].steps == 8
    assert openloop.models_for("default", quick=False)[0].steps == 20
    (sim,) = openloop.models_for(openloop.SIM_SPEC, quick=True)
    assert sim.flags() == ("--model", openloop.SIM_SPEC) and (sim.size, sim.steps) == (512, 4)
    assert sim.data(3)[4:7] == [512, 512, 4] and sim.data(3, 20)[6] == 20

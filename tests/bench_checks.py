"""What a complete benchmark result holds: the checks that a published run (``tests/unit/test_bench.py``)
and a fresh run (``tests/server/test_bench_runs.py``) both pass. Every figure present and finite; no
timing thresholds."""

from __future__ import annotations

from bench.report import finite_figures, render

FIGURES = {
    "overhead": {
        "raw_images_per_second",
        "app_images_per_second",
        "throughput_ratio",
        "gpu_busy_fraction",
        "inference_load_over_idle",
    },
    "memory": {"rss_1_mb", "rss_16_mb", "rss_16_over_1"},
    "cancel": {"steps_after_cancel", "steps_after_cancel_mean", "next_job_start_ms"},
    "cold_start": {"process_start_to_ready_s", "process_start_to_first_image_s"},
    "batching": {"raw_gain", "app_gain", "app_gain_over_raw_gain", "mean_batch_size"},
}


def check(results: dict) -> None:
    assert finite_figures(results)
    for size_row in results["overhead"].values():
        assert FIGURES["overhead"] <= set(size_row)
    for section in ("memory", "cancel", "cold_start"):
        assert FIGURES[section] <= set(results[section])
    for key in ("health_idle_ms", "health_load_ms", "light_idle_ms", "light_load_ms"):
        assert {"p50", "p95", "p99"} <= set(results["responsiveness"][key])
    assert set(results["designs"]) == {"gated", "whole_lock", "no_gate", "on_loop"}
    batching = results["batching"]
    rows = [row for row in batching.values() if isinstance(row, dict)]
    assert rows and all(FIGURES["batching"] <= set(row) for row in rows)
    assert {"low_load_latency_batched_over_unbatched", "rss_16_over_1_batched"} <= set(batching)
    table = render(results)
    assert "app / raw throughput" in table and "nan" not in table.lower()


RAY_FIGURES = {"ray2_over_ray1", "ray1_over_local", "ray_added_ms_per_request", "deploy_seconds", "seconds"}


def check_ray(results: dict) -> None:
    from bench import scale

    assert finite_figures(results)
    assert set(results) >= RAY_FIGURES
    assert set(results["images_per_second"]) == {"local", "ray1", "ray2"}
    assert set(results["outside_inference_ms"]) == {"local", "ray1"}
    table = scale.render(results, results["versions"])
    assert f"**{results['ray2_over_ray1']:.3f}**" in table and "nan" not in table.lower()


def check_cpu(result: dict, configs: set[str]) -> None:
    from bench import cpu

    assert finite_figures(result) and set(result["configs"]) == configs
    for c in result["configs"].values():
        assert len(c["ms_per_request"]) == len(c["images_per_second"]) == result["rounds"]
        assert all(ms > 0 for ms in c["ms_per_request"]) and c["q1"] <= c["median"] <= c["q3"]
    assert result["configs"][result["reference"]]["ratio_to_reference"]["median"] == 1.0
    assert "nan" not in cpu.render(result).lower()

"""The benchmark's report: every figure present and finite. No timing thresholds here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import finite_figures, render

ROOT = Path(__file__).resolve().parent.parent
FIGURES = {
    "overhead": {"raw_images_per_second", "app_images_per_second", "throughput_ratio", "gpu_busy_fraction",
                 "inference_load_over_idle"},
    "memory": {"rss_1_mb", "rss_16_mb", "rss_16_over_1"},
    "cancel": {"steps_after_cancel", "next_job_start_ms"},
    "cold_start": {"process_start_to_ready_s", "process_start_to_first_image_s"},
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
    table = render(results)
    assert "app / raw throughput" in table and "nan" not in table.lower()


def test_the_published_run_is_complete() -> None:
    check(json.loads((ROOT / "docs" / "bench-quick-2026-11-30.json").read_text()))


def test_a_figure_that_is_not_finite_is_caught() -> None:
    results = json.loads((ROOT / "docs" / "bench-quick-2026-11-30.json").read_text())
    results["memory"]["rss_16_over_1"] = float("nan")
    with pytest.raises(AssertionError):
        check(results)


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, "-m", "bench", "--quick", "--json", str(out)], cwd=ROOT, check=True,
                   timeout=600, capture_output=True)
    check(json.loads(out.read_text()))

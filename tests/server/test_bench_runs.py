"""The benchmarks run end to end, each in a quick mode: every figure present and finite, no timing thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_checks import check, check_cpu, check_ray
from tests.helpers import ROOT


def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    """``python -m bench --quick`` runs every section (under two minutes on 2 cores)."""
    out = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out)],
        cwd=ROOT,
        check=True,
        timeout=600,
        capture_output=True,
    )
    check(json.loads(out.read_text()))


@pytest.mark.slow
def test_ray_quick_mode_end_to_end(tmp_path: Path) -> None:
    """``python -m bench --backend ray --quick`` (about 2 minutes on 2 cores, most of it starting Ray)."""
    pytest.importorskip("ray")
    out = tmp_path / "ray.json"
    subprocess.run(
        [sys.executable, "-m", "bench", "--backend", "ray", "--quick", "--json", str(out)],
        cwd=ROOT,
        check=True,
        timeout=600,
        capture_output=True,
    )
    check_ray(json.loads(out.read_text()))


def test_the_fast_device_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.fast --quick`` on its SD-Turbo-like profile (one server: the suite's time; the
    null-device profile runs the same code): every row complete and finite (no timing thresholds)."""
    out = tmp_path / "fast.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.fast", "--quick", "--profiles", "sd-turbo-like", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["profile"] for r in rows] == ["sd-turbo-like"] and 0 < rows[0]["app_over_raw"] < 10
    assert all(r["errors"] == 0 and r["requests"] >= 24 and r["server_cpu_ms_per_request"] > 0 for r in rows)
    # the default model side, its inference under load over alone, the whole tree's memory
    assert all(r["model_side"] == "process" and r["inference_load_over_idle"] > 0 for r in rows)
    assert all(r["peak_tree_rss_mb"] > 100 for r in rows)
    (rejected,) = [s["rejected"] for s in result["servers"] if "rejected" in s]
    assert rejected["clients"] == 16 and rejected["idle_p99_ms"] > 0 and rejected["load_p99_ms"] > 0


def test_the_alternated_cpu_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.cpu``: each configuration measured in every round, the Gradio floor included."""
    out = tmp_path / "cpu.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cpu",
            "--rounds",
            "2",
            "--seconds",
            "1",
            "--configs",
            "thread,floor",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    check_cpu(json.loads(out.read_text()), {"thread", "floor"})


def test_the_prompt_reading_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.prompts``: every case timed in every round, finite, with its ratio to the
    pipeline's own ``encode_prompt``; a two-chunk prompt costs more than a plain one (two encoder rows)."""
    out = tmp_path / "prompts.json"
    done = subprocess.run([sys.executable, "-m", "bench.prompts", "--rounds", "5", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    names = {"encode_prompt (before)", "plain", "weighted", "two chunks", "validate (serving side)",
             "loop step: masked, one call", "loop step: a loop per count"}  # fmt: skip
    assert set(result["ms"]) == set(result["ratio_to_encode_prompt"]) == names
    assert all(0 < q["median"] < 10_000 for q in result["ms"].values())
    ratios = result["ratio_to_encode_prompt"]
    assert ratios["encode_prompt (before)"] == ratios["loop step: a loop per count"] == 1.0


def test_the_step_cache_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.step_cache`` (issue 50), its quick run: every method beside "off" in one run, the
    evaluations each computes, the eight-caller loads; a method that computes fewer evaluations is timed."""
    out = tmp_path / "step-cache.json"
    done = subprocess.run([sys.executable, "-m", "bench.step_cache", "--rounds", "1", "--no-quality", "--flux-rounds", "0", "--json",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    one = result["one_request_20_steps"]
    assert set(one) == {"off", "taylorseer", "reuse", "raw pipeline"}
    assert [one[m]["evaluations"] for m in ("off", "taylorseer", "reuse")] == [20, 10, 12]
    assert one["off"]["speedup_vs_off"] == 1.0 and all(0 < m["median_s"] < 60 for m in one.values())
    assert set(result["eight_callers"]) == {"8 off", "4 auto + 4 off", "8 auto"}


def test_the_gpu_cache_step_runs_here_at_toy_sizes(tmp_path: Path) -> None:
    """``bench/gpu.sh``'s ``cache`` step (``python -m bench.gpu_cache``) on this CPU at toy sizes, so that a
    lent device's one call does not find it broken: each method's evaluations, the eight callers, and a
    FLUX.1 transformer built in place of the loaded one (its depth and width from the flags)."""
    out = tmp_path / "cache.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_cache", "--model", str(ROOT / "assets" / "default-model"),
                           "--device", "cpu", "--size", "32", "--steps", "6", "--rounds", "1", "--flux-size", "32",
                           "--flux-blocks", "1,1", "--flux-heads", "1", "--sections", "sd15,flux", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    one = result["sd15"]["one_request"]
    assert [(one[m]["computed"], one[m]["skipped"]) for m in ("off", "taylorseer", "reuse")] == [(6, 0), (5, 1), (5, 1)]
    assert set(result["sd15"]["eight_callers"]) == {"8 off", "4 auto + 4 off", "8 auto"}
    flux = result["flux"]
    assert flux["model"].startswith("FLUX.1-dev transformer, width 128, 1 + 1 blocks")
    assert flux["one_request"]["taylorseer"]["skipped"] == 10 and set(flux["one_request"]) == {
        "off", "taylorseer", "reuse", "fbcache"}  # fmt: skip


def test_the_gpu_control_step_runs_here_at_toy_sizes(tmp_path: Path) -> None:
    """``bench/gpu.sh``'s ``control`` step (``python -m bench.control --model``) on this CPU at toy sizes:
    the ControlNet built from the folder's UNet, loaded as ``--controlnet``, every design measured."""
    from tests.families import built_family

    out = tmp_path / "control.json"
    done = subprocess.run([sys.executable, "-m", "bench.control", "--model", str(built_family("sd1")), "--device",
                           "cpu", "--size", "64", "--steps", "2", "--rounds", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["family"].startswith("sd 1.x") and result["size"] == 64 and result["device"] == "cpu"
    assert set(result["one_request"]) == {"no control", "control", "raw ControlNet pipeline"}
    assert set(result["eight_callers"]) == {"one loop, mixed", "one at a time", "a loop per kind",
                                            "a whole call for the controlled"}  # fmt: skip


def test_the_gpu_models_step_runs_here_at_toy_sizes(tmp_path: Path) -> None:
    """``bench/gpu.sh``'s ``models`` step (``python -m bench.models --model --second``) on this CPU at toy sizes,
    with the tiny SD 1.5 and SDXL builds as its two models: every switch and design measured (issue 52)."""
    from tests.families import built_family

    out = tmp_path / "models.json"
    done = subprocess.run([sys.executable, "-m", "bench.models", "--model", str(built_family("sd1")), "--second",
                           str(built_family("sdxl")), "--device", "cpu", "--size", "64", "--steps", "2",
                           "--rounds", "1", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["size"] == 64 and set(result["weights_mib"]) == {"first", "second"}
    assert set(result["traffic"]) == {"one model", "two models, this design", "two models, one at a time"}
    assert result["traffic"]["one model"]["switches"] == 0 and result["traffic"]["two models, one at a time"][
        "switches"] >= 7  # alternating one at a time: a switch a request  # fmt: skip
    assert result["switch_ms"]["from CPU memory"] > 0 and result["switch_ms"]["already on the device"] == 0

"""The published benchmark runs (bench/results/) are complete, and the benchmark's own arithmetic on known inputs.

Every figure present and finite; no timing thresholds here. The runs themselves are in
``tests/server/test_bench_runs.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import finite_figures
from tests.bench_checks import check, check_cpu, check_ray
from tests.helpers import ROOT

PUBLISHED = sorted(
    p
    for p in (ROOT / "bench" / "results").glob("bench-*.json")
    if not p.name.startswith(
        (
            "bench-ray-",
            "bench-fast-",
            "bench-loadgen-",
            "bench-openloop-",
            "bench-fairness-",
            "bench-cpu-",
            "bench-page-",
            "bench-lora-",
            "bench-imagejoin-",
            "bench-hostile-",
            "bench-step-cache-",
            "bench-control-",
            "bench-models-",
        )
    )
)
PUBLISHED_CPU = sorted((ROOT / "bench" / "results").glob("bench-cpu-*.json"))
PUBLISHED_OPENLOOP = sorted((ROOT / "bench" / "results").glob("bench-openloop-*.json"))
PUBLISHED_LOADGEN = sorted((ROOT / "bench" / "results").glob("bench-loadgen-*.json"))
PUBLISHED_FAST = sorted((ROOT / "bench" / "results").glob("bench-fast-*.json"))
PUBLISHED_RAY = sorted((ROOT / "bench" / "results").glob("bench-ray-*.json"))
PUBLISHED_GPU = sorted((ROOT / "bench" / "results").glob("gpu-*-bench.json"))


@pytest.mark.parametrize("path", PUBLISHED + PUBLISHED_GPU, ids=[p.name for p in PUBLISHED + PUBLISHED_GPU])
def test_the_published_runs_are_complete(path: Path) -> None:
    check(json.loads(path.read_text()))


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "results").glob("bench-lora-*.json")), ids=lambda p: p.name)
def test_the_published_lora_runs_are_complete(path: Path) -> None:
    from bench import lora

    result = json.loads(path.read_text())
    assert finite_figures(result)
    for traffic in lora.TRAFFICS:
        k = result[traffic]
        assert k["errors"] == 0 and k["requests"] >= 16 and k["model_loads"] == [1], (traffic, k)
        assert 0 < k["p50_ms"] <= k["p99_ms"]
    assert result["mixed"]["mean_batch_requests"] > 1.5 > result["mixed-separate"]["mean_batch_requests"]
    assert 0 < result["switch"]["other_adapter_ms"] < 1000 * result["switch"]["model_load_s"]
    assert "| mixed-separate |" in lora.render(result) and "nan" not in lora.render(result).lower()


@pytest.mark.parametrize(
    "path", sorted((ROOT / "bench" / "results").glob("bench-step-cache-*.json")), ids=lambda p: p.name
)
def test_the_published_step_cache_runs_are_complete(path: Path) -> None:
    result = json.loads(path.read_text())
    assert finite_figures(result)
    one = result["one_request_20_steps"]
    assert one["off"]["evaluations"] == 20 and one["taylorseer"]["evaluations"] < 20
    assert set(result["quality"]) == {"off", "taylorseer", "reuse"}
    assert all(q["all"]["images"] == result["quality"]["off"]["all"]["images"] > 0 for q in result["quality"].values())


@pytest.mark.parametrize(
    "path", sorted((ROOT / "bench" / "results").glob("bench-control-*.json")), ids=lambda p: p.name
)
def test_the_published_control_runs_are_complete(path: Path) -> None:
    result = json.loads(path.read_text())
    assert finite_figures(result) and result["rounds"] >= 1
    assert set(result["one_request"]) == {"no control", "control", "raw ControlNet pipeline"}
    assert {"one loop, mixed", "one at a time", "a loop per kind"} <= set(result["eight_callers"])  # and later designs
    assert (
        result["one_request"]["no control"]["vs_no_control"]
        == result["eight_callers"]["one loop, mixed"]["vs_one_loop"]
        == 1.0
    )


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "results").glob("bench-models-*.json")), ids=lambda p: p.name)
def test_the_published_models_runs_are_complete(path: Path) -> None:
    result = json.loads(path.read_text())
    assert finite_figures(result) and result["rounds"] >= 1 and result["cores"] >= 1
    assert set(result["traffic"]) == {"one model", "two models, this design", "two models, one at a time"}
    assert result["traffic"]["one model"]["vs_one_model"] == 1.0 and result["traffic"]["one model"]["switches"] == 0
    assert set(result["switch_ms"]) == {"from CPU memory", "already on the device"}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "bench" / "results").glob("bench-hostile-*.json")), ids=lambda p: p.name
)
def test_the_published_hostile_runs_are_complete(path: Path) -> None:
    result = json.loads(path.read_text())
    assert finite_figures(result) and result["rounds"] >= 1
    attacks = {"json", "lora", "apng", "scans", "inpaints", "bodies"}
    for design, rows in result["runs"].items():
        assert set(rows) == attacks, design
        for attack, runs in rows.items():
            assert len(runs) == result["rounds"], (design, attack)
            assert all(not r["attack_errors"] and not r["health_errors"] for r in runs), (design, attack)
    assert set(result["designs"]["this"]) == attacks


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "results").glob("bench-page-*.json")), ids=lambda p: p.name)
def test_the_published_page_runs_are_complete(path: Path) -> None:
    from bench import page

    result = json.loads(path.read_text())
    assert page.errors_of(result) == 0 and result["sections"]
    for section in result["sections"]:
        assert section["page"]["previews_per_job"] > 0 and section["api"]["previews_per_job"] == 0
        assert section["page_over_api_server_cpu"] > 0
    assert "| page |" in page.render(result)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "bench" / "results").glob("bench-imagejoin-*.json")), ids=lambda p: p.name
)
def test_the_published_image_join_runs_are_complete(path: Path) -> None:
    from bench import image_join

    result = json.loads(path.read_text())
    step, job = result["designs"]["step"], result["designs"]["job"]
    assert step["errors"] == job["errors"] == 0
    assert set(step["late_batching"]) == {"step"} and set(job["late_batching"]) == {"job"}
    assert set(step["late_steps_done"]) == {int(result["long_steps"] * result["strength"])}
    assert finite_figures(result["step_over_job"]) and "| step |" in image_join.render(result)


@pytest.mark.parametrize("path", PUBLISHED_OPENLOOP, ids=[p.name for p in PUBLISHED_OPENLOOP])
def test_the_published_open_loop_runs_are_complete(path: Path) -> None:
    from bench import openloop

    result = json.loads(path.read_text())
    assert finite_figures(result) and openloop.errors_of(result) == 0
    designs = {d for section in result["sections"] for d in section["capacity"]}
    assert designs == {"none", "job", "step"}
    assert "| step |" in openloop.render(result)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "bench" / "results").glob("bench-fairness-*.json")), ids=lambda p: p.name
)
def test_the_published_fair_share_runs_are_complete(path: Path) -> None:
    from bench import fairness

    result = json.loads(path.read_text())
    assert len(result["light_requests"]) == result["light"] > 0
    assert all(r["jobs_before"] >= 0 and r["heavy_waiting_at_arrival"] >= 0 for r in result["light_requests"])
    assert "| light request |" in fairness.render(result)


@pytest.mark.parametrize("path", PUBLISHED_RAY, ids=[p.name for p in PUBLISHED_RAY])
def test_the_published_ray_runs_are_complete(path: Path) -> None:
    check_ray(json.loads(path.read_text()))


def test_a_ray_run_missing_a_figure_is_caught() -> None:
    results = json.loads(PUBLISHED_RAY[-1].read_text())
    del results["images_per_second"]["ray2"]
    with pytest.raises((AssertionError, KeyError)):
        check_ray(results)


def test_a_figure_that_is_not_finite_is_caught() -> None:
    results = json.loads(PUBLISHED[-1].read_text())
    results["memory"]["rss_16_over_1"] = float("nan")
    with pytest.raises(AssertionError):
        check(results)


def test_steady_rate_counts_whole_jobs_inside_the_saturated_window() -> None:
    from bench.probe import steady_rate

    # 8 clients, 16 requests, batches of 4: a lone first job at t=1, then a batch every second.
    finished = [1.0] + [2.0] * 4 + [3.0] * 4 + [4.0] * 4 + [5.0] * 3
    # The window runs from the first answer (t=1) to the answer after which fewer than 8 remain
    # (the 9th, t=3): the two batches answered at t=2 and t=3, 8 requests in 2 s.
    assert steady_rate(finished, 8) == pytest.approx(4.0)
    # One at a time, one per second: the window counts every answer after the first.
    assert steady_rate([float(t) for t in range(1, 17)], 8) == pytest.approx(1.0)
    assert steady_rate(finished[:8], 8) is None  # too short to have a steady state
    assert steady_rate([2.0] * 12, 4) is None  # every answer at one moment: no window


def test_busy_fraction_counts_only_gaps_with_a_job_waiting() -> None:
    from bench.sections import busy_fraction

    def job(ready: float, start: float, end: float) -> dict:
        return {"timings": {"gpu_wait_start": ready, "infer_start": start, "infer_end": end}}

    infos = [
        job(0.0, 0.0, 1.0),
        job(0.0, 1.1, 2.1),  # waiting since 0: the 0.1 s handoff counts as idle
        job(3.0, 3.0, 4.0),  # arrived at 3, after the section went idle at 2.1: that gap is not the app's
        job(3.5, 4.0, 5.0),
        job(3.6, 4.0, 5.0),  # one batch, one span
    ]
    assert busy_fraction(infos) == pytest.approx(4.0 / 4.1)
    # Without gpu_wait_start: every gap counts.
    bare = [{"timings": {"infer_start": a, "infer_end": b}} for a, b in ((0.0, 1.0), (1.5, 2.5))]
    assert busy_fraction(bare) == pytest.approx(2.0 / 2.5)


def test_every_benchmark_server_serves_the_model_asked_for() -> None:
    """The first GPU run's overhead section failed: its unbatched servers had no ``--model`` and
    served the embedded model, which refused the SD 1.5 sizes."""
    from bench.__main__ import server_flags

    for flags in server_flags(3, "cuda", "/tmp/sd15-random"):
        assert flags[flags.index("--model") + 1] == "/tmp/sd15-random" and "cuda" in flags
    batched, unbatched = server_flags(1, "cpu", "")
    assert "--model" not in batched + unbatched and unbatched[-2:] == ["--max-batch-size", "1"]


@pytest.mark.slow
def test_the_gpu_benchmarks_sd15_model_builds_and_runs_on_the_cpu(tmp_path: Path) -> None:
    """The CPU half of bench/gpu.sh, so that a GPU session does not spend device time finding it
    broken: the full-size SD 1.5 architecture (random weights) builds, loads through the app's own
    ``from_pretrained`` path and draws. ~1 minute and ~5 GB of memory; run with -m slow."""
    import threading

    from bench.sd15 import build
    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model
    from pipeline.protocol import InferenceJob

    folder = build(tmp_path / "sd15", dtype="float16")
    model = load_model(Settings(model=str(folder), device="cpu"), warmup=False)
    assert model.profile.pipeline_class == "StableDiffusionPipeline"
    assert (model.profile.default_width, model.profile.size_multiple) == (512, 8)
    unet = sum(p.numel() for p in model.pipe.unet.parameters())
    assert 850e6 < unet < 870e6, unet  # SD 1.5's UNet: 860M parameters
    steps: list[tuple[int, int]] = []
    result = model.generate(
        InferenceJob("sd15", ("a red circle",), ("",), (1,), 64, 64, 2, 7.5),
        threading.Event(),
        lambda step, total, *_: steps.append((step, total)),
    )
    assert [image.size for image in result.images] == [(64, 64)]
    assert steps and steps[-1][0] == steps[-1][1]  # progress ends at n of n


@pytest.mark.parametrize("path", PUBLISHED_FAST, ids=[p.name for p in PUBLISHED_FAST])
def test_the_published_fast_device_runs_are_complete(path: Path) -> None:
    from bench.fast import PROFILES, render

    result = json.loads(path.read_text())
    assert finite_figures(result)
    assert {r["profile"] for r in result["rows"]} == set(PROFILES) and all(r["errors"] == 0 for r in result["rows"])
    assert "nan" not in render(result).lower()


@pytest.mark.parametrize("path", PUBLISHED_LOADGEN, ids=[p.name for p in PUBLISHED_LOADGEN])
def test_the_published_load_generator_comparisons_are_complete(path: Path) -> None:
    """Each run of ``bench.fast --client both``: both clients in every cell, no errors, the client's CPU."""
    from bench.fast import render

    result = json.loads(path.read_text())
    assert finite_figures(result) and result["runs"]
    for run in result["runs"]:
        cells: dict[tuple[str, int], set[str]] = {}
        for r in run["rows"]:
            cells.setdefault((r["profile"], r["clients"]), set()).add(r["client"])
            assert r["errors"] == 0 and r["requests"] > 0 and r["client_cpu_ms_per_request"] > 0
        assert run["client"] == "both" and all(kinds == {"gradio", "async"} for kinds in cells.values())
        assert "nan" not in render(run).lower()


@pytest.mark.parametrize("path", PUBLISHED_CPU, ids=[p.name for p in PUBLISHED_CPU])
def test_the_published_cpu_runs_are_complete(path: Path) -> None:
    result = json.loads(path.read_text())
    # a run of some configurations (--configs) names exactly those; process is always one
    assert "process" in result["configs"]
    check_cpu(result, set(result["configs"]))


def test_the_gpu_check_finds_a_missing_wheel_a_wrong_version_and_an_over_budget_script(tmp_path: Path) -> None:
    """``bash bench/gpu.sh --check``'s parts on made-up wheels and scripts (issue 36 §6; no network)."""
    import zipfile

    from bench import carry, gpu_check

    def wheel(name: str, version: str, *requires: str) -> None:
        path = tmp_path / f"{name}-{version}-py3-none-any.whl"
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{name}-{version}.dist-info/METADATA", meta)

    for name in carry.NEEDED:
        wheel(name, "1.0")
    wheel(
        "gradio", "6.31.0", "fastapi<1.0,>=0.115", "numpy<3", "starlette>=1.0", "audioop-lts; python_version >= '3.13'"
    )
    (tmp_path / "gradio-1.0-py3-none-any.whl").unlink()
    wheel("starlette", "0.9")
    lines = carry.missing(tmp_path)
    assert "missing: fastapi (fastapi<1.0,>=0.115), required by gradio" in lines  # not on the device
    assert "wrong version: starlette 0.9 carried, gradio requires starlette>=1.0" in lines
    assert not [line for line in lines if "numpy" in line or "audioop" in line]  # on the device; a 3.13 marker
    script = gpu_check.SCRIPT.read_text()
    assert gpu_check.budget_problems(script) == []
    tight = script.replace("GPU_SH_BUDGET_S:-570", "GPU_SH_BUDGET_S:-300")
    assert gpu_check.budget_problems(tight) and "over the budget of 300 s" in gpu_check.budget_problems(tight)[0]

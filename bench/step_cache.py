"""Step caching per request (issue 50), in process, on the embedded model: speed and quality side by side.

    python -m bench.step_cache [--rounds 5] [--json PATH]

All through the app's own step-level loop (``DiffusersModel.open_loop``, as the server runs requests),
each method beside ``off`` in the same run (rounds alternate the order, so the machine's drift falls on
all alike):

- **one request** at 20 steps, 64 px: the loop's time per method, its ratio to ``off`` and to the raw
  pipeline's own call (``pipe(...)``), and the denoiser evaluations computed and skipped;
- **8 concurrent callers** in one loop: all ``off``, against four with ``auto`` and four ``off`` (the
  mixed load a server sees), and all ``auto``: images a second;
- **quality**: the default model's evaluation (``pipeline.default_model.evaluate``: background,
  foreground and shape scored from the pixels, held-out and seen combinations, two seeds) per method,
  and each picture's mean difference from the same request uncached (1/255 units).

No thresholds: figures for ``docs/performance.md#step-caching``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("off", "taylorseer", "reuse")
STEPS = 20


def _job(rid: str, prompt: str, seed: int, cache: str, guidance: float, steps: int = STEPS) -> Any:
    from pipeline.protocol import InferenceJob

    return InferenceJob(request_id=rid, prompts=(prompt,), negative_prompts=("",), seeds=(seed,), width=64,
                        height=64, num_inference_steps=steps, guidance_scale=guidance, joinable=True,
                        options=(("step_cache", cache),))  # fmt: skip


def run_loop(model: Any, jobs: list[Any]) -> tuple[dict[str, Any], float]:
    """Every job in one loop from its first step, as the server runs concurrent callers: (images by
    request id, seconds)."""
    started = time.perf_counter()
    loop = model.open_loop(jobs[0])
    slots = {job.request_id: loop.add(job) for job in jobs}
    images: dict[str, Any] = {}
    while loop.images:
        loop.step()
        done = [rid for rid, s in slots.items() if rid not in images and loop.steps_done(s) >= loop.total_steps(s)]
        if done:
            decoded = loop.decode([slots[rid] for rid in done])
            images.update({rid: decoded[slots[rid]] for rid in done})
    return images, time.perf_counter() - started


def speed(model: Any, rounds: int, guidance: float) -> dict[str, Any]:
    import torch

    from pipeline.engine.loop.step_cache import METHODS as SCHEDULES

    prompt = "a red circle on a blue background"
    times: dict[str, list[float]] = {name: [] for name in (*METHODS, "raw pipeline")}
    mixed: dict[str, list[float]] = {"8 off": [], "4 auto + 4 off": [], "8 auto": []}
    for r in range(rounds):
        order = list(METHODS) if r % 2 == 0 else list(reversed(METHODS))
        for name in order:
            times[name].append(run_loop(model, [_job("one", prompt, r, name, guidance)])[1])
        started = time.perf_counter()
        model.pipe(prompt, num_inference_steps=STEPS, guidance_scale=guidance, width=64, height=64,
                   generator=[torch.Generator().manual_seed(r)])  # fmt: skip
        times["raw pipeline"].append(time.perf_counter() - started)
        for label, cached in (("8 off", 0), ("4 auto + 4 off", 4), ("8 auto", 8)):
            jobs = [_job(f"c{i}", prompt, r * 10 + i, "taylorseer" if i < cached else "off", guidance)
                    for i in range(8)]  # fmt: skip
            mixed[label].append(run_loop(model, jobs)[1])
    off = statistics.median(times["off"])
    one = {
        name: {
            "median_s": round(statistics.median(ts), 4),
            "speedup_vs_off": round(off / statistics.median(ts), 2),
            "evaluations": SCHEDULES[name].evaluations(STEPS) if name in SCHEDULES else STEPS,
        }
        for name, ts in times.items()
    }
    eight_off = statistics.median(mixed["8 off"])
    concurrent = {
        label: {
            "images_per_s": round(8 / statistics.median(ts), 2),
            "vs_8_off": round(eight_off / statistics.median(ts), 2),
        }
        for label, ts in mixed.items()
    }
    return {"one_request_20_steps": one, "eight_callers": concurrent}


def quality(model: Any, guidance: float) -> dict[str, Any]:
    from pipeline.default_model import evaluate, shapes

    items = [(p, spec, seed) for p, spec in evaluate.prompt_set() for seed in evaluate.SEEDS]
    out: dict[str, Any] = {}
    uncached: dict[str, Any] = {}
    for name in METHODS:
        pictures: dict[str, Any] = {}
        seconds = 0.0
        for start in range(0, len(items), 16):
            batch = items[start : start + 16]
            jobs = [_job(f"i{start + i}", p, seed, name, guidance) for i, (p, _, seed) in enumerate(batch)]
            images, took = run_loop(model, jobs)
            pictures.update({rid: imgs[0] for rid, imgs in images.items()})
            seconds += took
        held, seen, diffs = [], [], []
        for i, (_, spec, _) in enumerate(items):
            image = pictures[f"i{i}"]
            (held if spec.combo in shapes.HELD_OUT else seen).append((spec, shapes.score(image)))
            if name == "off":
                uncached[f"i{i}"] = np.asarray(image, dtype=np.float32)
            diffs.append(float(np.abs(np.asarray(image, dtype=np.float32) - uncached[f"i{i}"]).mean()))
        out[name] = {
            "all": evaluate.accuracy(held + seen),
            "held_out": evaluate.accuracy(held),
            "mean_difference_from_off": round(statistics.fmean(diffs), 2),
            "largest_difference_from_off": round(max(diffs), 2),
            "seconds": round(seconds, 2),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-quality", action="store_true", help="speed only (the test's quick run)")
    args = parser.parse_args(argv)

    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    model: Any = load_model(Settings(), warmup=False)
    guidance = model.profile.default_guidance
    run_loop(model, [_job("warm", "a red circle", 0, "off", guidance, steps=2)])  # first-call costs aside
    result: dict[str, Any] = {"model": model.profile.name, "cores": os.cpu_count(), "steps": STEPS, "size": 64,
                              "guidance": guidance}  # fmt: skip
    result.update(speed(model, args.rounds, guidance))
    if not args.no_quality:
        result["quality"] = quality(model, guidance)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

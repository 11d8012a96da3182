"""Step caching on a lent GPU (issue 50): ``bash bench/gpu.sh``'s ``cache`` step.

    python -m bench.gpu_cache --model SD15_FOLDER --json OUT [--device cuda] [--size 512] [--steps 20]
                              [--flux-size 1024] [--flux-blocks 19,38] [--flux-heads 24] [--rounds 2]

In process, through the app's own ``load_model`` and step-level loop (``bench.step_cache.run_loop``),
each method beside ``off`` in the same run, the device synchronised around every timing:

- **sd15**: the SD 1.5 build (``bench.sd15``), one request per method at ``--steps``, and 8 callers
  (all off, four auto beside four off, all auto): seconds, the ratio to off, images a second;
- **compiled**: ``--compile``, a loop of an uncached member beside a taylorseer one (the batch shrinks
  on its skipped steps): recompiles after the warm-up (dynamo's unique graphs) and seconds against
  eager with the same members;
- **flux**: FLUX.1-dev at its full width (``--flux-heads`` of 128) and depth (``--flux-blocks``: 19
  double, 38 single), random weights built on the device in bfloat16 (no download; the loaded folder's
  small transformer swapped for it: the same config but its depth), at ``--flux-size`` px, 20 steps:
  off, taylorseer, reuse and fbcache (its hit rate: random weights decide it, not a trained model).

Each section is written to ``--json`` as it ends, so a timed-out step keeps what it measured. With
``--device cpu`` and small sizes it runs here too (``tests/server/test_bench_runs.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.step_cache import cache_job, eight_callers, run_loop, wide_flux

PROMPT = "a red circle on a blue background"
SMALL = dict(num_layers=1, num_single_layers=1, num_attention_heads=1)  # the loaded folder's, swapped out at once


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(device: str, fn: Callable[[], Any]) -> float:
    _sync(device)
    started = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - started


def methods(model: Any, names: tuple[str, ...], size: int, steps: int, rounds: int, device: str) -> dict[str, Any]:
    """One request per method, rounds alternating the order: median seconds, ratio to off, evaluations."""
    guidance = model.profile.default_guidance
    times: dict[str, list[float]] = {n: [] for n in names}
    reports: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for name in names if r % 2 == 0 else tuple(reversed(names)):
            job = cache_job("one", PROMPT, r, name, guidance, steps, size)
            loop = model.open_loop(job)

            def one(loop: Any = loop, job: Any = job, name: str = name) -> None:
                slot = loop.add(job)
                while loop.steps_done(slot) < loop.total_steps(slot):
                    loop.step()
                loop.decode([slot])
                reports[name] = dict(loop.result_fields(slot)["step_cache"]) or {"computed": steps, "skipped": 0}

            times[name].append(_timed(device, one))
    off = statistics.median(times["off"])
    return {n: {"median_s": round(statistics.median(times[n]), 4),
                "speedup_vs_off": round(off / statistics.median(times[n]), 2), **reports[n]} for n in names}  # fmt: skip


def sd15(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.config import load_settings
    from pipeline.engine.model.loading import load_model

    model: Any = load_model(load_settings(["--model", args.model, "--device", args.device]))
    one = methods(model, ("off", "taylorseer", "reuse"), args.size, args.steps, args.rounds, args.device)
    guidance = model.profile.default_guidance
    jobs = [cache_job(f"c{i}", PROMPT, i, "off", guidance, 2, args.size) for i in range(8)]
    _timed(args.device, lambda: run_loop(model, jobs))  # the batch shapes' first calls aside
    callers = eight_callers(model, args.rounds, guidance, args.steps, args.size)
    return {"size": args.size, "steps": args.steps, "one_request": one, "eight_callers": callers}


def compiled(args: argparse.Namespace) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    from pipeline.config import load_settings
    from pipeline.engine.model.loading import load_model

    out: dict[str, Any] = {}
    for flags in ((), ("--compile",)):
        key = "compiled" if flags else "eager"
        model: Any = load_model(load_settings(["--model", args.model, "--device", args.device, *flags]))
        guidance = model.profile.default_guidance
        jobs = [cache_job("off", PROMPT, 1, "off", guidance, args.steps, args.size),
                cache_job("cached", PROMPT, 2, "taylorseer", guidance, args.steps, args.size)]  # fmt: skip
        graphs = counters["stats"]["unique_graphs"]
        seconds = _timed(args.device, functools.partial(run_loop, model, jobs))
        out[key] = {
            "seconds": round(seconds, 3),
            "recompiles_after_warmup": counters["stats"]["unique_graphs"] - graphs,
        }
    return out


def flux(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from diffusers import FluxTransformer2DModel

    from pipeline.config import load_settings
    from pipeline.engine.model.loading import load_model

    doubles, singles = (int(n) for n in args.flux_blocks.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        model: Any = load_model(
            load_settings(["--model", str(wide_flux(Path(tmp) / "flux", **SMALL)), "--device", args.device])
        )
    small = model.pipe.transformer
    config = {**dict(small.config), "num_layers": doubles, "num_single_layers": singles,
              "num_attention_heads": args.flux_heads}  # fmt: skip
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    torch.manual_seed(5)
    started = time.perf_counter()
    with torch.device(args.device):
        full: Any = FluxTransformer2DModel(**config)
    model.pipe.transformer = full.to(small.dtype).eval()
    built = time.perf_counter() - started
    del small
    one = methods(model, ("off", "taylorseer", "reuse", "fbcache"), args.flux_size, 20, args.rounds, args.device)
    for row in one.values():
        total = row["computed"] + row["skipped"]
        row["hit_rate"] = round(row["skipped"] / total, 3) if total else 0.0
    width = args.flux_heads * 128
    return {"model": f"FLUX.1-dev transformer, width {width}, {doubles} + {singles} blocks, random weights",
            "build_s": round(built, 1), "size": args.flux_size, "steps": 20, "one_request": one}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the SD 1.5 build (bench.sd15)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flux-size", type=int, default=1024)
    parser.add_argument("--flux-blocks", default="19,38", help="double,single (FLUX.1-dev: 19,38)")
    parser.add_argument("--flux-heads", type=int, default=24, help="of 128 each (FLUX.1-dev: 24, width 3072)")
    parser.add_argument("--sections", default="sd15,compiled,flux")
    args = parser.parse_args(argv)
    import os

    result: dict[str, Any] = {"device": args.device, "cores": os.cpu_count()}
    if args.device == "cuda":
        import torch

        result["device"] = torch.cuda.get_device_name(0)
    for name in args.sections.split(","):
        result[name] = {"sd15": sd15, "compiled": compiled, "flux": flux}[name](args)
        args.json.write_text(json.dumps(result, indent=1))
        print(name, json.dumps(result[name]), flush=True)


if __name__ == "__main__":
    main()

"""LoRA traffic (issue 29): what per-request adapters cost, and mixed batches against a loop per adapter.

    python -m bench.lora [--quick] [--model FOLDER] [--json PATH]

Four tiny random peft LoRAs (``tests/loras.py``) on the model (default: the embedded one), every
request ``SIZE`` px and ``STEPS`` steps, ``CALLERS`` closed-loop callers through the launched app
(the model in its own process, ``--max-batch-size 4``). Three traffics, alternated round by round
(A B C C B A ...) so that a noisy neighbour hits each alike:

- ``single``: every caller on the same adapter (the "my LoRA on FLUX" Space);
- ``mixed``: caller i on adapter i mod 4, on a server with ``--lora-batching mixed`` (each row of a
  step-level loop through its own adapter, peft's mixed-adapter batches);
- ``mixed-separate``: the same traffic on ``--lora-batching separate`` (a loop per adapter and scale).

Figures: images/s and p50/p99 latency per traffic, the ratios, and against the raw pipeline: the
same requests called one after another on a plain diffusers pipeline with ``set_adapters`` per
request (the naive design: no batching, a switch per request). The switch itself is timed in
process: ``set_adapters`` to another adapter, to another scale, and ``disable_lora``, against one
model load. No thresholds: the figures go to the table and ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench import loadgen
from bench.harness import Server
from bench.stats import percentile

NAMES = ("ink", "glow", "grain", "neon")
CALLERS = 8
SIZE, STEPS = 256, 8
TRAFFICS = ("single", "mixed", "mixed-separate")


def make_adapters(model: Path, tmp: Path) -> dict[str, Path]:
    from tests.loras import make_lora

    return {name: make_lora(model, tmp / name, seed=i + 1) for i, name in enumerate(NAMES)}


def switch_costs(model: Path, loras: dict[str, Path], repeats: int) -> dict[str, Any]:
    """Milliseconds per switch on the model side (median of ``repeats``), and one model load's seconds."""
    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model
    from pipeline.protocol import LoraUse

    t0 = time.perf_counter()
    loaded = load_model(Settings(model=str(model), loras=tuple(f"{n}={p}" for n, p in loras.items())), warmup=False)
    load_s = time.perf_counter() - t0
    loaded_loras = loaded.loras  # type: ignore[union-attr]
    assert loaded_loras is not None

    def timed(a: LoraUse, b: LoraUse) -> float:
        samples = []
        for _ in range(repeats):
            loaded_loras.use(a)
            samples.append(loaded_loras.use(b))
        return statistics.median(samples)

    return {
        "model_load_s": load_s,
        "other_adapter_ms": timed(LoraUse("ink", 1.0), LoraUse("glow", 1.0)),
        "other_scale_ms": timed(LoraUse("ink", 1.0), LoraUse("ink", 0.5)),
        "to_none_ms": timed(LoraUse("ink", 1.0), LoraUse()),
        "layers": len(loaded_loras._denoiser_layers),
    }


def adapter_of(traffic: str, caller: int) -> str:
    return NAMES[0] if traffic == "single" else NAMES[caller % len(NAMES)]


async def closed_loop(
    url: str, traffic: str, n: int, first: int, size: int = SIZE, steps: int = STEPS
) -> dict[str, Any]:
    """``n`` requests from CALLERS callers, each sending its next when its last is answered."""
    outcomes: list[loadgen.Outcome] = []
    infos: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=4 * CALLERS, max_keepalive_connections=4 * CALLERS)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        fn_index, trigger_id = await loadgen._endpoint(http, url, "generate")
        counter = iter(range(n))
        t0 = time.perf_counter()

        async def caller(c: int) -> None:
            session = uuid.uuid4().hex[:11]
            for k in counter:
                data = loadgen.generate_data(first + k, size, steps, lora=adapter_of(traffic, c))
                outcome = await loadgen.async_request(http, url, fn_index, trigger_id, session, data)
                outcomes.append(outcome)
                if outcome.info:
                    infos.append(outcome.info)

        await asyncio.gather(*(caller(c) for c in range(CALLERS)))
        seconds = time.perf_counter() - t0
    good = [o for o in outcomes if o.ok]
    failed = [o.error for o in outcomes if not o.ok]
    return {"ok": len(good), "errors": len(failed), "first_error": failed[0] if failed else None, "seconds": seconds,
            "latencies_ms": [o.latency_ms for o in good],
            "batch_requests": [i.get("batch_requests", 1) for i in infos],
            "loads": sorted({i.get("model_loads") for i in infos if i.get("model_loads") is not None})}  # fmt: skip


def raw_rate(model: Path, loras: dict[str, Path], traffic: str, n: int, size: int, steps: int) -> float:
    """The naive design on a plain diffusers pipeline: one request after another, ``set_adapters`` each."""
    import warnings

    import torch
    from diffusers import DiffusionPipeline

    from pipeline.config import Settings
    from pipeline.engine.model.loading import pick_device, pick_dtype

    torch.set_num_threads(Settings().resolved_torch_threads())  # the model process's threads: like for like
    device = pick_device("auto")
    pipe = DiffusionPipeline.from_pretrained(str(model), torch_dtype=pick_dtype("auto", device, "")).to(device)
    pipe.set_progress_bar_config(disable=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        for name, path in loras.items():
            pipe.load_lora_weights(str(path), adapter_name=name)
    t0 = time.perf_counter()
    for k in range(n):
        pipe.set_adapters([adapter_of(traffic, k)], [1.0])
        pipe(f"a red circle {k}", width=size, height=size, num_inference_steps=steps, guidance_scale=7.5,
             generator=torch.Generator("cpu").manual_seed(k))  # fmt: skip
    return n / (time.perf_counter() - t0)


def figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [ms for r in rounds for ms in r["latencies_ms"]]
    batch = [b for r in rounds for b in r["batch_requests"]]
    jobs = sum(r["ok"] for r in rounds)
    return {
        "requests": jobs,
        "errors": sum(r["errors"] for r in rounds),
        "first_error": next((r["first_error"] for r in rounds if r["first_error"]), None),
        "images_per_second": jobs / max(1e-9, sum(r["seconds"] for r in rounds)),
        "p50_ms": percentile(latencies, 50) if latencies else None,
        "p99_ms": percentile(latencies, 99) if latencies else None,
        "mean_batch_requests": statistics.fmean(batch) if batch else None,
        "model_loads": sorted({x for r in rounds for x in r["loads"]}),
    }


def run(
    model: Path | None, rounds: int, per_round: int, tmp: Path, size: int = SIZE, steps: int = STEPS
) -> dict[str, Any]:
    from pipeline.default_model import ensure_default_model

    folder = model or ensure_default_model()
    loras = make_adapters(folder, tmp / "loras")
    # One address for every caller (one "user"): room for all eight in the handler and in line.
    flags = ["--model", str(folder), "--max-pixel-steps", str(10**12), "--max-size", str(size),
             "--concurrency", "16", "--max-waiting-per-user", "16", "--rate-limit", "1000"]  # fmt: skip
    flags += [arg for name, path in loras.items() for arg in ("--lora", f"{name}={path}")]
    servers = {
        "single": Server("gated", tmp / "single", *flags, "--lora-batching", "mixed"),
        "mixed": None,  # the same server as single: one design, two traffics
        "mixed-separate": Server("gated", tmp / "separate", *flags, "--lora-batching", "separate"),
    }
    servers["mixed"] = servers["single"]
    by: dict[str, list[dict[str, Any]]] = {t: [] for t in TRAFFICS}
    try:
        for traffic in TRAFFICS:  # warm each path once
            asyncio.run(closed_loop(servers[traffic].url, traffic, CALLERS, 10**6, size, steps))  # type: ignore[union-attr]
        for r in range(rounds):
            for traffic in TRAFFICS if r % 2 == 0 else TRAFFICS[::-1]:
                url = servers[traffic].url  # type: ignore[union-attr]
                by[traffic].append(asyncio.run(closed_loop(url, traffic, per_round, r * 1000, size, steps)))
    finally:
        for server in {id(s): s for s in servers.values() if s is not None}.values():
            server.close()
    out: dict[str, Any] = {t: figures(by[t]) for t in TRAFFICS}
    out["raw_single_images_per_second"] = raw_rate(folder, loras, "single", per_round, size, steps)
    out["raw_mixed_images_per_second"] = raw_rate(folder, loras, "mixed", per_round, size, steps)
    out["switch"] = switch_costs(folder, loras, repeats=20)
    s, m, sep = (out[t]["images_per_second"] for t in TRAFFICS)
    out["mixed_over_single"] = m / s
    out["mixed_over_separate"] = m / sep
    out["single_over_raw"] = s / out["raw_single_images_per_second"]
    out["mixed_over_raw"] = m / out["raw_mixed_images_per_second"]
    out.update(model=str(model) if model else "embedded-default", size=size, steps=steps, callers=CALLERS,
               rounds=rounds, per_round=per_round)  # fmt: skip
    return out


def render(result: dict[str, Any]) -> str:
    def f(value: Any, fmt: str = ".0f") -> str:
        return "-" if value is None else format(value, fmt)

    sw = result["switch"]
    lines = [f"LoRA traffic ({result['cores']} cores, {result['model']}, {result['size']} px, {result['steps']} steps, "
             f"{result['callers']} callers, 4 adapters, {result['rounds']} rounds of {result['per_round']})", "",
             "| traffic | img/s | p50 ms | p99 ms | requests / call | model loads | errors |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in TRAFFICS:
        k = result[t]
        lines.append(f"| {t} | {k['images_per_second']:.2f} | {f(k['p50_ms'])} | {f(k['p99_ms'])} | "
                     f"{f(k['mean_batch_requests'], '.2f')} | {k['model_loads']} | {k['errors']} |")  # fmt: skip
    lines += [
        "",
        f"mixed / single {result['mixed_over_single']:.2f}; mixed / separate "
        f"{result['mixed_over_separate']:.2f}; app / raw diffusers (one call per request, set_adapters each): "
        f"single {result['single_over_raw']:.2f}, mixed {result['mixed_over_raw']:.2f}",
        "",
        f"switch: another adapter {sw['other_adapter_ms']:.2f} ms, another scale {sw['other_scale_ms']:.2f} ms, "
        f"to none {sw['to_none_ms']:.2f} ms ({sw['layers']} LoRA layers); a model load {sw['model_load_s']:.2f} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16 requests (CI-sized)")
    parser.add_argument(
        "--model", type=Path, default=None, help="a local diffusers folder (default: the embedded model)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--size", type=int, default=SIZE, help=f"width and height of every request (default {SIZE})")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps of every request (default {STEPS})")
    args = parser.parse_args(argv)
    rounds, per_round = (2, 16) if args.quick else (4, 32)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        result = run(args.model, rounds, per_round, Path(tmp), args.size, args.steps)
    result.update(cores=os.cpu_count(), seconds=time.time() - t0, date=time.strftime("%Y-%m-%d"))
    print(render(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

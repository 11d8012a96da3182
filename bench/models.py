"""Several models on one server (issue 52), in process: what a switch costs and what mixed traffic gets,
side by side in one run.

    python -m bench.models [--rounds 3] [--json PATH]
    python -m bench.models --model SD15_FOLDER --second SDXL_FOLDER --device cuda --size 512   # bench/gpu.sh

Two models (default: the embedded model and the tiny SD 1.5 build of ``tests/families.py``) on one
``ModelShelf`` under a device budget that fits one of them, served by the app's own ``LocalAdapter`` (its
scheduler, gate and step-level loops; the model on its ``gpu-worker`` thread), ``SIZE`` px, ``STEPS``
steps, ``CALLERS`` requests submitted together, rounds alternating the order:

- **switches**: a model moved onto the device from CPU memory (the others moved off first) and one already
  there, against loading it from disk (``from_pretrained``: what a server of one model per switch pays);
- **traffic**: every request on one model (one model's throughput); the callers alternating between the two
  models through this design (the fair line's head picks the model, its batch takes every waiting request of
  it); and the naive design, one request at a time in arrival order (a switch whenever the model changes,
  no batching): images a second, and the switches each made.

No thresholds: figures for ``docs/performance.md#several-models``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import publish

STEPS = 12
SIZE = 64
CALLERS = 8
NAMES = ("first", "second")


def request(model: str, seed: int, size: int, steps: int) -> dict[str, Any]:
    return {"prompt": "a red circle on a blue background", "negative_prompt": "", "seed": seed,
            "randomize_seed": False, "width": size, "height": size, "num_inference_steps": steps,
            "guidance_scale": 4.0, "num_images": 1, "live_preview": False, "model": model}  # fmt: skip


async def _one(adapter: Any, raw: dict[str, Any]) -> dict[str, Any]:
    async with contextlib.aclosing(adapter.run(raw)) as events:
        async for event in events:
            if event.kind == "done":
                return dict(event.info)
    raise RuntimeError("no result")


async def _together(adapter: Any, raws: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(_one(adapter, raw) for raw in raws))
    return time.perf_counter() - t0


async def _one_at_a_time(adapter: Any, raws: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    for raw in raws:
        await _one(adapter, raw)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="the first model (default: the embedded one)")
    parser.add_argument("--second", default=None, help="the second model (default: the tiny SD 1.5 build)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from pipeline.config import Settings, load_settings
    from pipeline.engine.hosting.runner import ModelRunner
    from pipeline.engine.model.loading import load_model, load_one
    from pipeline.request import limits_for
    from pipeline.serving.local import LocalAdapter

    second = args.second
    if second is None:
        from tests.families import built_family

        second = str(built_family("sd1"))
    first = args.model or "embedded-default"
    probe = load_settings(["--model", f"{NAMES[0]}={first}", "--model", f"{NAMES[1]}={second}",
                           "--device", args.device], {})  # fmt: skip
    sizing: Any = load_model(probe, warmup=False)  # the weights' sizes: a budget that fits the larger alone
    budget_mib = max(s.bytes for s in sizing.states()) / 2**20 * 1.05
    del sizing
    settings = load_settings(["--model", f"{NAMES[0]}={first}", "--model", f"{NAMES[1]}={second}", "--device",
                              args.device, "--device-memory-budget", f"{budget_mib:.3f}", "--max-batch-size", "4"],
                             {})  # fmt: skip
    runner = ModelRunner(lambda: load_model(settings))
    profile = runner.start()
    out = Path(tempfile.mkdtemp(prefix="bench-models-"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True)
    thread.start()
    adapter = LocalAdapter(runner, limits_for(settings, profile), out, max_batch_size=4, step_joining=True)

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def switched() -> tuple[float, float]:  # (switches, their seconds) so far: /metrics' model_switch_seconds
        registry = adapter.metrics.registry
        count = registry.get_sample_value("model_switch_seconds_count") or 0.0
        return float(count), float(registry.get_sample_value("model_switch_seconds_sum") or 0.0)

    shelf: Any = runner.model
    run(_one(adapter, request(NAMES[0], 0, args.size, args.steps)))  # warm both
    run(_one(adapter, request(NAMES[1], 0, args.size, args.steps)))
    moves: dict[str, list[float]] = {"from CPU memory": [], "already on the device": []}
    loads: list[float] = []
    for r in range(args.rounds):
        name = NAMES[r % 2]
        other = NAMES[1 - r % 2]
        run(_one(adapter, request(other, r, args.size, args.steps)))  # the other one on the device
        _, before = switched()
        run(_one(adapter, request(name, r, args.size, args.steps)))  # the others off, it on: the switch
        _, after = switched()
        run(_one(adapter, request(name, r + 1, args.size, args.steps)))  # already there
        moves["from CPU memory"].append((after - before) * 1000)
        moves["already on the device"].append((switched()[1] - after) * 1000)
        t0 = time.perf_counter()
        source = (None if first == "embedded-default" else first) if name == NAMES[0] else second
        load_one(Settings(model=source, device=args.device), warmup=False)
        loads.append((time.perf_counter() - t0) * 1000)
    designs: dict[str, list[float]] = {"one model": [], "two models, this design": [], "two models, one at a time": []}
    switches: dict[str, list[float]] = {name: [] for name in designs}
    for r in range(args.rounds):
        order = list(designs) if r % 2 == 0 else list(designs)[::-1]
        for design in order:
            seeds = range(100 * r, 100 * r + CALLERS)
            models = [NAMES[0]] * CALLERS if design == "one model" else [NAMES[i % 2] for i in range(CALLERS)]
            raws = [request(m, s, args.size, args.steps) for m, s in zip(models, seeds)]
            before, _ = switched()
            seconds = run(_one_at_a_time(adapter, raws) if design.endswith("one at a time") else
                          _together(adapter, raws))  # fmt: skip
            designs[design].append(CALLERS / seconds)
            switches[design].append(switched()[0] - before)
    one = statistics.median(designs["one model"])
    result = {
        "bench": "models", "cores": os.cpu_count(), "device": args.device, "size": args.size, "steps": args.steps,
        "callers": CALLERS, "rounds": args.rounds, "models": [first, second], "budget_mib": round(budget_mib, 3),
        "weights_mib": {s.name: round(s.bytes / 2**20, 3) for s in shelf.states()},
        "switch_ms": {k: round(statistics.median(v), 3) for k, v in moves.items()},
        "load_from_disk_ms": round(statistics.median(loads), 1),
        "traffic": {k: {"images_per_s": round(statistics.median(v), 3),
                        "vs_one_model": round(statistics.median(v) / one, 3),
                        "switches": statistics.median(switches[k])} for k, v in designs.items()},
    }  # fmt: skip
    adapter.close()
    runner.shutdown(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    publish(result, args.json)


if __name__ == "__main__":
    main()

"""The Ray backend's benchmark: ``python -m bench --backend ray [--quick]``.

Three model sides, all alive at once and driven from this process in interleaved rounds, torch on
one thread each:

- ``local``: a ``LocalAdapter`` over one ``gpu-worker`` thread in this process (the reference);
- ``ray1``: a ``RayAdapter`` over a Ray Serve deployment of 1 replica;
- ``ray2``: a ``RayAdapter`` over a deployment of 2 replicas.

Figures (ratios of the same run): throughput of ``ray2`` over ``ray1`` under saturating load
(target >= 1.6 at 256 px on 2 cores), ``ray1`` over ``local``, and the per-request overhead the
Ray path adds at one replica: a request's latency outside its own inference, Ray minus local, on
sequential requests (no queueing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.config import Settings
from pipeline.request import limits_for
from pipeline.serving.local import LocalAdapter

ROOT = Path(__file__).resolve().parent.parent


def request(size: int, steps: int, k: int) -> dict[str, Any]:
    return {
        "prompt": f"a red circle on a blue background {k}",
        "negative_prompt": "",
        "seed": k,
        "randomize_seed": False,
        "width": size,
        "height": size,
        "num_inference_steps": steps,
        "guidance_scale": 4.0,
        "num_images": 1,
        "live_preview": False,
    }


async def one(adapter: Any, raw: dict[str, Any]) -> dict[str, Any]:
    async with contextlib.aclosing(adapter.run(raw)) as events:
        async for event in events:
            if event.kind == "done":
                return event.info
    raise RuntimeError("no result")


async def saturate(adapter: Any, size: int, steps: int, n: int, first: int) -> tuple[float, list[dict[str, Any]]]:
    """``n`` requests at once; (images per second, their info records)."""
    t0 = time.perf_counter()
    infos = await asyncio.gather(*(one(adapter, request(size, steps, first + k)) for k in range(n)))
    return n / (time.perf_counter() - t0), list(infos)


async def sequential(adapter: Any, size: int, steps: int, n: int, first: int) -> list[float]:
    """Milliseconds each request spent outside its own inference, one request at a time."""
    outside = []
    for k in range(n):
        t0 = time.perf_counter()
        info = await one(adapter, request(size, steps, first + k))
        total_ms = (time.perf_counter() - t0) * 1000
        outside.append(total_ms - info["durations_ms"]["inference"])
    return outside


def run(quick: bool, device: str = "cpu", model: str = "") -> dict[str, Any]:
    import ray

    from pipeline.engine.hosting.runner import ModelRunner
    from pipeline.engine.model.loading import load_model
    from pipeline.ray.adapter import RayAdapter
    from pipeline.ray.cluster import start, stop

    size, steps = (128, 20) if quick else (256, 20)
    n, rounds, seq = (4, 1, 4) if quick else (8, 2, 10)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    base = Settings(
        model=model or None,
        device=device,
        torch_threads=1,
        max_batch_size=1,
        queue_size=64,
        output_dir=tmp / "out",
        sweep_interval=3600,
        backend="ray",
        replica_cpus=1,
        replica_gpus=1 if device == "cuda" else 0,
    )
    t_start = time.monotonic()
    cores = os.cpu_count() or 2
    # Logical CPUs: three replicas (1 + 2) must be placed at once; each runs one torch thread and
    # only one deployment works at a time.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # Ray starts its workers at nice 15; the LocalAdapter's model thread runs at 0 in this process.
    # Like for like: the replicas at 0 too (the raylet reads this when it starts).
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(
        num_cpus=max(3, cores),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    results: dict[str, Any] = {"size": size, "steps": steps, "requests_per_round": n, "rounds": rounds}
    clusters = []
    try:
        t0 = time.monotonic()
        c1 = start(dataclasses.replace(base, replicas=1), app_name="bench-r1")
        clusters.append(c1)
        c2 = start(dataclasses.replace(base, replicas=2), app_name="bench-r2")
        clusters.append(c2)
        results["deploy_seconds"] = time.monotonic() - t0
        runner = ModelRunner(lambda: load_model(dataclasses.replace(base, backend="local")))
        profile = runner.start()
        local = LocalAdapter(runner, limits_for(base, profile), tmp / "local", max_batch_size=1)
        sides = {"local": local, "ray1": RayAdapter(c1, base), "ray2": RayAdapter(c2, base)}

        async def measure() -> dict[str, Any]:
            for adapter in sides.values():  # warm every path once
                await one(adapter, request(size, 2, 10_000))
            tput: dict[str, list[float]] = {k: [] for k in sides}
            replicas_used: set[str] = set()
            for r in range(rounds):
                for name, adapter in sides.items():
                    ips, infos = await saturate(adapter, size, steps, n, 1000 * r)
                    tput[name].append(ips)
                    if name == "ray2":
                        replicas_used |= {i["replica"] for i in infos}
            outside: dict[str, list[float]] = {"local": [], "ray1": []}
            for r in range(2):  # interleaved halves
                for name in outside:
                    outside[name] += await sequential(sides[name], 64, steps, seq // 2, 5000 + 100 * r)
            mean = {k: statistics.fmean(v) for k, v in tput.items()}
            return {
                "images_per_second": mean,
                "ray2_over_ray1": mean["ray2"] / mean["ray1"],
                "ray1_over_local": mean["ray1"] / mean["local"],
                "replicas_used_by_ray2": len(replicas_used),
                "outside_inference_ms": {k: statistics.median(v) for k, v in outside.items()},
                "ray_added_ms_per_request": statistics.median(outside["ray1"]) - statistics.median(outside["local"]),
            }

        results.update(asyncio.run(measure()))
        for adapter in sides.values():
            adapter.close()
        local.shutdown_model(timeout=5)
    finally:
        for cluster in clusters:
            stop(cluster)
        with contextlib.suppress(Exception):
            from ray import serve

            serve.shutdown()
        ray.shutdown()
    results["seconds"] = time.monotonic() - t_start
    return results


def render(r: dict[str, Any], versions: dict[str, str]) -> str:
    ips = r["images_per_second"]
    o = r["outside_inference_ms"]
    return "\n".join(
        [
            f"Ray backend ({r['mode']}, {r['seconds']:.0f} s): {versions['cores']} cores {versions['cpu']}, "
            f"ray {versions.get('ray', '?')}, torch 1 thread per replica, {r['size']} px, {r['steps']} steps, "
            f"{r['requests_per_round']} concurrent requests x {r['rounds']} interleaved rounds",
            "",
            "| model side | images/s | vs 1 replica |",
            "|---|---|---|",
            f"| LocalAdapter (in process) | {ips['local']:.3f} | {ips['local'] / ips['ray1']:.3f} |",
            f"| Ray Serve, 1 replica | {ips['ray1']:.3f} | 1.000 |",
            f"| Ray Serve, 2 replicas | {ips['ray2']:.3f} | **{r['ray2_over_ray1']:.3f}** |",
            "",
            f"2 replicas used {r['replicas_used_by_ray2']} of 2. Per request, outside its inference (64 px, "
            f"one at a time, median): LocalAdapter {o['local']:.1f} ms, Ray 1 replica {o['ray1']:.1f} ms: the Ray "
            f"path adds **{r['ray_added_ms_per_request']:.1f} ms**. Deploying both Ray apps took "
            f"{r['deploy_seconds']:.0f} s.",
        ]
    )

"""Batching designs under open-loop load (issue 19, section 5).

    python -m bench.openloop [--quick] [--model default|sim:...] [--requests N] [--json PATH]

One run launches three servers of this app on the same model, differing only in how they batch:

- ``none``: ``--max-batch-size 1 --step-joining off`` (one request per inference);
- ``job``:  ``--max-batch-size 4 --step-joining off`` (job-level dynamic batching: requests batch
  only when a job starts);
- ``step``: ``--max-batch-size 4 --step-joining on`` (step-level continuous batching: compatible
  requests join a running denoising loop at a step boundary).

and measures, for each, with the designs alternated (A B C, then C B A, ...) so that the machine's
drift favours none of them:

1. **capacity**: the saturated rate (images/s) of a closed loop of 8 callers (``bench.loadgen``'s
   asyncio client; ``bench.probe.steady_rate``'s saturated window). The ``none`` design's defines
   100 % load for the whole section;
2. **open loop**: Poisson arrivals (seeded exponential gaps, the same schedule for every design) at
   50, 80 and 95 % of that capacity, one image per request, each request fired at its scheduled time
   whether or not the earlier ones are done: p50 / p95 / p99 latency (scheduled submit to the
   answer with the images) and the achieved rate;
3. **burst**: 8 requests at once: the makespan (first submit to last answer), against the same 8
   one by one on the ``none`` server, and that gain against the raw pipeline's own (the same 8 one
   by one and in batches of 4, in the same rounds: ``RawBurst``);
4. **late arrival**: a request sent a few steps into a long (20-step) compatible job: its wait
   before its first step (its info record's ``durations_ms.gpu_wait``) against one step of the
   running job (its inference time over its steps);
5. **memory**: the peak RSS of the server's process tree under 16 concurrent requests against one
   full batch (4 concurrent requests).

Sections: the embedded default model at 64 px (8 steps with ``--quick``, 20 otherwise) and the
simulated fast device (``SIM_SPEC``); ``--model`` runs one of them (``default``), any ``sim:``
spec or a model folder (a tiny family build, at 64 px, with its raw pipeline as the reference) alone. The model side is the app's default. No thresholds: the figures go to the tables (and
``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

from bench import loadgen
from bench.__main__ import Server, finite_figures
from bench.openloop_parts import (  # re-exported: the plan, the models, the async client, the raw burst
    BATCH,
    COMMON,
    DEFAULT_SIZE,
    DESIGNS,
    FULL,
    LOADS,
    QUICK,
    SIM_SPEC,
    TIMEOUT,
    Model,
    Plan,
    RawBurst,
    fire,
    late_arrival,
    memory,
    models_for,
    warm,
)
from bench.openloop_report import errors_of, render
from bench.probe import steady_rate
from bench.stats import (  # re-exported: the open-loop figures' own helpers
    Shot,
    late_figures,
    latency_summary,
    open_loop_summary,
    orders,
    percentile,
    poisson_schedule,
    schedule_rate,
)

__all__ = [
    "BATCH",
    "COMMON",
    "DEFAULT_SIZE",
    "DESIGNS",
    "FULL",
    "LOADS",
    "QUICK",
    "SIM_SPEC",
    "TIMEOUT",
    "Model",
    "Plan",
    "RawBurst",
    "Shot",
    "errors_of",
    "fire",
    "late_arrival",
    "late_figures",
    "latency_summary",
    "models_for",
    "open_loop_summary",
    "orders",
    "percentile",
    "poisson_schedule",
    "render",
    "schedule_rate",
]  # fmt: skip

# --- the measurements ---------------------------------------------------------------------------------


def capacity(servers: dict[str, Server], model: Model, plan: Plan) -> dict[str, Any]:
    """Each design's saturated rate in a closed loop of ``capacity_clients`` callers, rounds alternated."""
    rates: dict[str, list[float]] = {d: [] for d in servers}
    whole: dict[str, list[float]] = {d: [] for d in servers}
    sizes: dict[str, list[int]] = {d: [] for d in servers}
    errors = dict.fromkeys(servers, 0)
    for r, order in enumerate(orders(list(servers), plan.capacity_rounds)):
        first = 1000 + r * plan.capacity_requests
        for design in order:
            result = asyncio.run(
                loadgen.run_async(
                    servers[design].url,
                    plan.capacity_clients,
                    n=plan.capacity_requests,
                    timeout=TIMEOUT,
                    data=model.numbered(first),
                )
            )
            steady = steady_rate(result.finished, plan.capacity_clients)
            rates[design].append(steady if steady is not None else result.images_per_second)
            whole[design].append(result.images_per_second)
            sizes[design] += [int(i.get("batch_size") or 1) for i in result.infos]
            errors[design] += result.errors
    return {
        d: {
            "images_per_second": statistics.fmean(rates[d]),
            "whole_run_images_per_second": statistics.fmean(whole[d]),
            "mean_batch_size": statistics.fmean(sizes[d]) if sizes[d] else None,
            "rounds": len(rates[d]),
            "errors": errors[d],
        }
        for d in servers
    }


def open_loop(servers: dict[str, Server], model: Model, plan: Plan, rate_100: float) -> dict[str, Any]:
    """Poisson arrivals at each load, the same schedule for every design, designs alternated per load."""
    out: dict[str, Any] = {}
    names = list(servers)
    for i, load in enumerate(plan.loads):
        rate = load * rate_100
        seed = plan.seed * 1000 + round(load * 100)
        schedule = poisson_schedule(rate, plan.open_requests, seed, exact=plan.exact_rate)
        point: dict[str, Any] = {
            "load": load,
            "rate_per_second": rate,
            "seed": seed,
            "requests": plan.open_requests,
            "exact_rate": plan.exact_rate,
            "schedule_rate_per_second": schedule_rate(schedule),
            "schedule_seconds": schedule[-1],
        }
        for design in names if i % 2 == 0 else names[::-1]:
            shots = asyncio.run(fire(servers[design].url, schedule, model.data, first=10_000 * (i + 1)))
            point[design] = open_loop_summary(shots, offered=rate)
        out[f"{round(load * 100)}%"] = point
    return out


def burst(servers: dict[str, Server], model: Model, plan: Plan) -> dict[str, Any]:
    """``burst`` requests at once on each design against the same requests one by one on ``none``:
    the sequential run opens and closes every round. Each round also runs the raw reference
    (``RawBurst``): the gain a design gets over one by one, against the gain batching gives the raw
    pipeline on the same requests."""
    makespans: dict[str, list[float]] = {d: [] for d in servers}
    sizes: dict[str, list[int]] = {d: [] for d in servers}
    errors = dict.fromkeys(servers, 0)
    sequential: list[float] = []
    raw_one: list[float] = []
    raw_batched: list[float] = []
    seq_errors = 0
    raw = RawBurst(model, plan.burst)

    def one_by_one() -> None:
        nonlocal seq_errors
        result = asyncio.run(
            loadgen.run_async(servers["none"].url, 1, n=plan.burst, timeout=TIMEOUT, data=model.numbered(20_000))
        )
        sequential.append(result.seconds)
        seq_errors += result.errors

    try:
        for order in orders(list(servers), plan.burst_rounds):
            one_by_one()
            one, batched = raw.measure()
            raw_one.append(one)
            raw_batched.append(batched)
            for design in order:
                shots = asyncio.run(fire(servers[design].url, [0.0] * plan.burst, model.data, first=20_000))
                makespans[design].append(max(s.finished for s in shots) - min(s.sent for s in shots))
                sizes[design] += [int(s.info.get("batch_size") or 1) for s in shots if s.ok and s.info]
                errors[design] += sum(1 for s in shots if not s.ok)
        one_by_one()
    finally:
        raw.close()
    seq = statistics.fmean(sequential)
    raw_gain = statistics.fmean(raw_one) / statistics.fmean(raw_batched)
    rows: dict[str, Any] = {
        "requests": plan.burst,
        "sequential_on_none_s": seq,
        "sequential_errors": seq_errors,
        "raw": {
            "one_by_one_s": statistics.fmean(raw_one),
            "batched_s": statistics.fmean(raw_batched),
            "batch": BATCH,
            "gain": raw_gain,
        },
    }
    for d in servers:
        span = statistics.fmean(makespans[d])
        rows[d] = {
            "makespan_s": span,
            "over_sequential": span / seq,
            "errors": errors[d],
            "gain": seq / span,
            "gain_over_raw_gain": seq / span / raw_gain,
            "mean_batch_size": statistics.fmean(sizes[d]) if sizes[d] else None,
        }
    return rows


def late(servers: dict[str, Server], model: Model, plan: Plan, idle_long_s: dict[str, float]) -> dict[str, Any]:
    """The late arrival on each design, rounds alternated; the median of each figure over the rounds."""
    got: dict[str, list[dict[str, Any]]] = {d: [] for d in servers}
    for r, order in enumerate(orders(list(servers), plan.late_rounds)):
        for design in order:
            fallback = idle_long_s[design] * (plan.late_after + 0.5) / plan.late_steps + 0.5
            got[design].append(asyncio.run(late_arrival(servers[design].url, model, plan, fallback, 30_000 + 2 * r)))
    rows: dict[str, Any] = {"long_steps": plan.late_steps, "sent_after_steps": plan.late_after}
    for d, runs in got.items():
        good = [g for g in runs if not g["errors"]]
        row: dict[str, Any] = {"rounds": len(runs), "errors": sum(g["errors"] for g in runs)}
        for key in ("step_ms", "wait_ms", "wait_over_step", "arrived_at_step", "late_latency_ms"):
            values = [g[key] for g in good if g.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["sent_while_running"] = all(g.get("sent_while_running") for g in good)
        row["late_batch_size"] = [g.get("late_batch_size") for g in good]
        row["batching"] = next((g["batching"] for g in good if g.get("batching")), None)
        row["joined_at_step"] = [g.get("joined_at_step") for g in good]
        rows[d] = row
    return rows


def start_servers(model: Model, tmp: Path, designs: Sequence[str]) -> dict[str, Server]:
    """The designs' servers, loading together; an error names the one that did not come up."""
    servers: dict[str, Server] = {}
    try:
        for d in designs:
            servers[d] = Server("gated", tmp / f"{model.name}-{d}", *model.flags(), *COMMON, *DESIGNS[d], start=False)
        for d, server in servers.items():
            server.wait_ready()
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"the {d} server ({' '.join(DESIGNS[d])}) exited with {server.proc.returncode}; "
                    f"try `python app.py {' '.join([*model.flags(), *DESIGNS[d]])}` by hand"
                )
    except BaseException:
        for server in servers.values():
            server.close()
        raise
    return servers


def run_section(
    model: Model, plan: Plan, tmp: Path, designs: Sequence[str] = tuple(DESIGNS), base: str = "none"
) -> dict[str, Any]:
    if "none" not in designs:
        raise ValueError("the none design defines 100 % load and the sequential reference")
    stages: dict[str, float] = {}
    t_start = time.monotonic()
    servers = start_servers(model, tmp, designs)
    stages["start"] = time.monotonic() - t_start
    try:

        def timed(name: str, fn: Callable[..., Any], *a: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*a)
            finally:
                stages[name] = round(time.monotonic() - t0, 1)

        idle_long = timed("warm", lambda: {d: warm(s, model, plan) for d, s in servers.items()})
        cap = timed("capacity", capacity, servers, model, plan)
        rate_100 = cap[base]["images_per_second"]
        section = {
            "model": model.name,
            "spec": model.spec,
            "size": model.size,
            "steps": model.steps,
            "designs": {d: [*COMMON, *DESIGNS[d]] for d in designs},
            "capacity": cap,
            "rate_100_images_per_second": rate_100,
            "capacity_clients": plan.capacity_clients,
            "load_base": base,
        }
        section["open_loop"] = timed("open_loop", open_loop, servers, model, plan, rate_100)
        section["burst"] = timed("burst", burst, servers, model, plan)
        section["late"] = timed("late", late, servers, model, plan, idle_long)
        section["memory"] = timed("memory", memory, servers, model, plan)
        section["ready_s"] = {d: s.ready_after for d, s in servers.items()}
    finally:
        for server in servers.values():
            server.close()
    section["stage_seconds"] = {k: round(v, 1) for k, v in stages.items()}
    section["seconds"] = round(time.monotonic() - t_start, 1)
    return section


def run(
    quick: bool,
    model: str | None = None,
    plan: Plan | None = None,
    designs: Sequence[str] = tuple(DESIGNS),
    base: str = "none",
) -> dict[str, Any]:
    plan = plan or (QUICK if quick else FULL)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-openloop-") as tmpdir:
        sections = [run_section(m, plan, Path(tmpdir), designs, base) for m in models_for(model, quick)]
    return {
        "quick": quick,
        "cores": psutil.cpu_count(),
        "plan": dataclasses.asdict(plan),
        "sections": sections,
        "seconds": round(time.monotonic() - started, 1),
    }


# --- the report ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (under ~4 minutes on 2 cores)")
    parser.add_argument(
        "--model",
        default=None,
        help="default (the embedded model at 64 px), a sim:... spec or a model folder (64 px, "
        "e.g. a tiny family build of tests/families.py); omitted: both sections",
    )
    parser.add_argument("--requests", type=int, default=None, help="open-loop requests per design and load")
    parser.add_argument(
        "--load-base",
        choices=("none", "job"),
        default="none",
        help="whose saturated rate is 100 %% load: none (one request per inference, the "
        "GPU's own capacity; default) or job (job-level batching, the app before step joining)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.model not in (None, "default") and not args.model.startswith("sim:") and not Path(args.model).is_dir():
        parser.error("--model is default, a sim:... spec or a model folder")
    plan = QUICK if args.quick else FULL
    if args.requests:
        plan = dataclasses.replace(plan, open_requests=args.requests)
    result = run(args.quick, args.model, plan, base=args.load_base)
    print(render(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if errors_of(result) == 0 and finite_figures(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())

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
import math
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
import psutil

from bench import loadgen
from bench.harness import Raw, Server
from bench.probe import steady_rate
from bench.report import finite_figures
from bench.stats import (
    Shot,
    late_figures,
    open_loop_summary,
    orders,
    poisson_schedule,
    schedule_rate,
)

# --- the designs, the plan and the models ---------------------------------------------------------


BATCH = 4
DESIGNS: dict[str, tuple[str, ...]] = {
    "none": ("--max-batch-size", "1", "--step-joining", "off"),
    "job": ("--max-batch-size", str(BATCH), "--step-joining", "off"),
    "step": ("--max-batch-size", str(BATCH), "--step-joining", "on"),
    # on request (--designs): the app with every request's step cache "auto" (issue 50), and the naive
    # design, one lock around the whole handler (bench.servers' whole_lock), one request at a time
    "cache": ("--max-batch-size", str(BATCH), "--step-joining", "on", "--step-cache", "auto"),
    "lock": ("--max-batch-size", "1", "--step-joining", "off"),
}
DEFAULT_DESIGNS = ("none", "job", "step")
SERVER_DESIGN = {"lock": "whole_lock"}  # bench.servers' design of each (else "gated": this app)
# The same serving limits for every design: room for the 16-request memory check and for the
# open loop's backlog at 95 % load, so that no design refuses or queues in Gradio's line instead of
# its own. Every request has its own session, so the per-user cap (half of --concurrency) is moot.
COMMON = ("--concurrency", "32", "--queue-size", "256")
SIM_SPEC = "sim:cpu_ms=5,dev_ms=15,decode_ms=8,size=512,steps=4"
DEFAULT_SIZE = 64
LOADS = (0.5, 0.8, 0.95)
TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of each measurement a run makes."""

    capacity_clients: int = 8
    capacity_requests: int = 32  # per design per round
    capacity_rounds: int = 2  # A B C, then C B A
    loads: tuple[float, ...] = LOADS
    open_requests: int = 120  # per design per load
    burst: int = 8
    burst_rounds: int = 3
    late_steps: int = 20  # the long job's steps (and the late request's)
    late_after: int = 3  # steps into the long job at which the late request is sent
    late_rounds: int = 5
    rss_full: int = 16
    seed: int = 19
    exact_rate: bool = True  # each schedule scaled to its nominal mean rate (see poisson_schedule)


# Full: ~11 minutes on 2 cores (the default model's 20-step 64 px images at ~4-5/s, the simulated device's
# at ~10/s; the open loop is most of it: 120 requests at 50, 80 and 95 % take 4.3 x 120 / capacity
# seconds per design). Quick: ~2.5 minutes, every figure once, p99 of 24 requests is their largest.
FULL = Plan()
QUICK = Plan(capacity_requests=24, capacity_rounds=1, open_requests=24, burst_rounds=1, late_rounds=1)


@dataclasses.dataclass(frozen=True)
class Model:
    """One section's model: ``spec`` None is the embedded default model (no ``--model`` flag)."""

    name: str
    spec: str | None
    size: int
    steps: int

    def flags(self) -> tuple[str, ...]:
        return () if self.spec is None else ("--model", self.spec)

    def data(self, k: int, steps: int | None = None) -> list[Any]:
        return loadgen.generate_data(k, self.size, steps or self.steps)

    def numbered(self, first: int, steps: int | None = None) -> Callable[[int], list[Any]]:
        """The inputs of requests ``first``, ``first + 1``, ... (prompts and seeds distinct per phase)."""
        return lambda k: self.data(first + k, steps)


def models_for(model: str | None, quick: bool) -> list[Model]:
    """The sections: both by default, or the one ``--model`` names."""
    from pipeline.engine.model.simulated import SimSpec

    default = Model("default", None, DEFAULT_SIZE, 8 if quick else 20)

    def sim(spec: str) -> Model:
        parsed = SimSpec.parse(spec)
        return Model("sim", spec, parsed.size, parsed.steps)

    if model is None:
        return [default, sim(SIM_SPEC)]
    if model == "default":
        return [default]
    if not model.startswith("sim:"):  # a model folder (a tiny family build): 64 px, as the default
        return [Model(Path(model).name, model, DEFAULT_SIZE, default.steps)]
    return [sim(model)]


# --- the async client -----------------------------------------------------------------------------


def _client(n: int) -> httpx.AsyncClient:
    # two connections per request in flight (its join and its event stream), never a wait for one
    return httpx.AsyncClient(
        timeout=TIMEOUT, limits=httpx.Limits(max_connections=None, max_keepalive_connections=2 * n + 4)
    )


async def fire(url: str, schedule: Sequence[float], data: Callable[[int], list[Any]], first: int = 0) -> list[Shot]:
    """Send request ``k`` at ``schedule[k]`` seconds from now, each on its own session, whether or not
    the earlier ones are answered; wait for every answer."""
    async with _client(len(schedule)) as http:
        fn_index, trigger_id = await loadgen._endpoint(http, url, "generate")
        start = time.monotonic() + 0.02

        async def one(k: int, at: float) -> Shot:
            due = start + at
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            sent = time.monotonic()
            out = await loadgen.async_request(http, url, fn_index, trigger_id, uuid.uuid4().hex[:11], data(first + k))
            return Shot(due, sent, out.finished, out.ok, len(out.image_urls), out.info, out.error)

        return list(await asyncio.gather(*(one(k, at) for k, at in enumerate(schedule))))


async def _denoise_steps(http: httpx.AsyncClient, url: str) -> float | None:
    """The server's ``denoise_steps_total`` counter, or None where it has none."""
    text = (await http.get(url + "metrics")).text
    for line in text.splitlines():
        if line.startswith("denoise_steps_total "):
            return float(line.split()[1])
    return None


async def late_arrival(url: str, model: Model, plan: Plan, fallback_s: float, k: int) -> dict[str, Any]:
    """A long job, then a compatible request once the server has counted ``late_after`` of its steps
    (or after ``fallback_s`` where it counts none)."""
    async with _client(2) as http:
        fn_index, trigger_id = await loadgen._endpoint(http, url, "generate")
        base = await _denoise_steps(http, url)

        def request(j: int) -> Any:
            return loadgen.async_request(
                http, url, fn_index, trigger_id, uuid.uuid4().hex[:11], model.data(j, plan.late_steps)
            )

        long_task = asyncio.create_task(request(k))
        deadline = time.monotonic() + fallback_s
        while not long_task.done() and time.monotonic() < deadline:
            count = None if base is None else await _denoise_steps(http, url)
            if count is not None and base is not None and count - base >= plan.late_after:
                break
            await asyncio.sleep(0.005 if count is not None else fallback_s / 20)
        sent_while_running = not long_task.done()
        late = await request(k + 1)
        long = await long_task
    if not (long.ok and late.ok and long.info and late.info):
        return {"errors": int(not long.ok) + int(not late.ok), "error_messages": [long.error, late.error]}
    return {
        **late_figures(long.info, late.info, plan.late_steps),
        "sent_while_running": sent_while_running,
        "late_latency_ms": late.latency_ms,
        "errors": 0,
    }


# --- the measurements -----------------------------------------------------------------------------


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


class RawBurst:
    """The burst's physical reference: the raw pipeline (``bench.raw``, the app's one torch thread) or
    the simulated device in this process, running the burst's requests one by one and in batches of
    ``BATCH``, as a job-level server at saturation would. Its one-by-one / batched is the most any
    batching design can gain on this machine at ``--max-batch-size BATCH``."""

    def __init__(self, model: Model, n: int) -> None:
        self.model, self.n = model, n
        self.raw: Raw | None = None
        if model.spec is None or not model.spec.startswith("sim:"):
            self.raw = Raw(1, "cpu", model.spec or "")
            self.raw.wait_ready()
            self.raw.run(model.size, model.steps, 1, warm=True, batch=BATCH)
            self.raw.run(model.size, model.steps, 1, warm=True)

    def measure(self) -> tuple[float, float]:
        """Seconds for the burst one by one, then in batches of BATCH (the last one smaller)."""
        sizes = [min(BATCH, self.n - i) for i in range(0, self.n, BATCH)]
        if self.raw is not None:
            size, steps = self.model.size, self.model.steps
            one = self.raw.run(size, steps, self.n, first=20_000)
            batched = sum(self.raw.run(size, steps, 1, first=20_000 + i * BATCH, batch=b) for i, b in enumerate(sizes))
            return one, batched
        import threading

        from pipeline.engine.model.simulated import SimSpec, SimulatedModel
        from pipeline.protocol import InferenceJob

        sim = SimulatedModel(SimSpec.parse(str(self.model.spec)), "raw")

        def job(images: int) -> InferenceJob:
            return InferenceJob(
                "raw",
                ("p",) * images,
                ("",) * images,
                tuple(range(images)),
                self.model.size,
                self.model.size,
                self.model.steps,
                0.0,
            )

        def seconds(batches: list[int]) -> float:
            t0 = time.perf_counter()
            for b in batches:
                sim.generate(job(b), threading.Event(), lambda *_: None)
            return time.perf_counter() - t0

        seconds(sizes)  # its pictures made once, as in the app
        return seconds([1] * self.n), seconds(sizes)

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()


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


def memory(servers: dict[str, Server], model: Model, plan: Plan) -> dict[str, Any]:
    """Peak RSS of each server's process tree: one full batch (``BATCH`` concurrent), then ``rss_full``."""
    rows: dict[str, Any] = {}
    for design in servers:
        server = servers[design]
        batch_shots, one = server.peak_rss(lambda s=server: asyncio.run(fire(s.url, [0.0] * BATCH, model.data, 40_000)))
        many_shots, many = server.peak_rss(
            lambda s=server: asyncio.run(fire(s.url, [0.0] * plan.rss_full, model.data, 40_000))
        )
        rows[design] = {
            "rss_batch_mb": one / 2**20,
            "rss_full_mb": many / 2**20,
            "full_over_batch": many / one,
            "errors": sum(1 for s in [*batch_shots, *many_shots] if not s.ok),
        }
    rows["concurrent"] = {"batch": BATCH, "full": plan.rss_full}
    return rows


def warm(server: Server, model: Model, plan: Plan) -> float:
    """Every compiled path and picture once (the sizes, the batch, the simulated device's picture pool);
    returns the seconds of one long (``late_steps``) job alone, the late arrival's fallback."""
    from pipeline.engine.model.simulated import POOL

    pool = POOL if model.spec and model.spec.startswith("sim:") else 2
    asyncio.run(loadgen.run_async(server.url, 1, n=pool, data=model.data, timeout=TIMEOUT))
    asyncio.run(fire(server.url, [0.0] * BATCH, model.data))
    t0 = time.monotonic()
    asyncio.run(loadgen.run_async(server.url, 1, n=1, data=model.numbered(0, plan.late_steps), timeout=TIMEOUT))
    return time.monotonic() - t0


# --- the run --------------------------------------------------------------------------------------


def start_servers(model: Model, tmp: Path, designs: Sequence[str]) -> dict[str, Server]:
    """The designs' servers, loading together; an error names the one that did not come up."""
    servers: dict[str, Server] = {}
    try:
        for d in designs:
            servers[d] = Server(SERVER_DESIGN.get(d, "gated"), tmp / f"{model.name}-{d}", *model.flags(), *COMMON,
                                *DESIGNS[d], start=False)  # fmt: skip
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
    model: Model, plan: Plan, tmp: Path, designs: Sequence[str] = DEFAULT_DESIGNS, base: str = "none"
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
    designs: Sequence[str] = DEFAULT_DESIGNS,
    base: str = "none",
    size: int | None = None,
    steps: int | None = None,
) -> dict[str, Any]:
    plan = plan or (QUICK if quick else FULL)
    started = time.monotonic()
    models = [dataclasses.replace(m, size=size or m.size, steps=steps or m.steps) for m in models_for(model, quick)]
    with tempfile.TemporaryDirectory(prefix="bench-openloop-") as tmpdir:
        sections = [run_section(m, plan, Path(tmpdir), designs, base) for m in models]
    return {
        "quick": quick,
        "cores": psutil.cpu_count(),
        "plan": dataclasses.asdict(plan),
        "sections": sections,
        "seconds": round(time.monotonic() - started, 1),
    }


# --- the tables -----------------------------------------------------------------------------------


def _f(value: Any, fmt: str = ".0f") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _joined(steps: Sequence[int | None]) -> str:
    """The late requests' ``joined_at_step`` over the rounds ("-" where the records carry none)."""
    return ", ".join(str(j) for j in steps if j is not None) or "-"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"Open-loop batching benchmark ({'quick' if result['quick'] else 'full'}, {result['cores']} cores, "
        f"{result['seconds']:.0f} s)"
    ]
    for s in result["sections"]:
        names = [d for d in DESIGNS if d in s["capacity"]]
        what = "embedded default model" if s["spec"] is None else f"`{s['spec']}`"
        cap = s["capacity"]
        lines += [
            "",
            f"### {s['model']}: {what}, {s['size']} px, {s['steps']} steps",
            "",
            f"100 % load = the `{s.get('load_base', 'none')}` design's saturated rate, "
            f"{s['capacity_clients']} callers in a closed "
            f"loop: **{s['rate_100_images_per_second']:.2f} img/s**. Latency: scheduled submit to images "
            f"received; seeded Poisson arrivals (the same for every design), "
            f"{s['open_loop'][next(iter(s['open_loop']))]['requests']} requests per point, one image each; "
            "img/s: achieved (mean batch).",
            "",
        ]
        points = list(s["open_loop"])
        head = ["design", "saturated img/s (mean batch)"]
        for p in points:
            head += [f"{p} ({s['open_loop'][p]['rate_per_second']:.2f}/s): p50 / p95 / p99 ms", f"{p}: img/s (batch)"]
        lines += ["| " + " | ".join(head) + " | errors |", "|" + "---|" * (len(head) + 1)]
        for d in names:
            errors = cap[d]["errors"]
            row = [d, f"{cap[d]['images_per_second']:.2f} ({_f(cap[d]['mean_batch_size'], '.2f')})"]
            for p in points:
                o = s["open_loop"][p][d]
                lat = o["latency_ms"]
                row += [
                    f"{_f(lat.get('p50'))} / {_f(lat.get('p95'))} / {_f(lat.get('p99'))}",
                    f"{o['achieved_images_per_second']:.2f} ({_f(o['mean_batch_size'], '.2f')})",
                ]
                errors += o["errors"]
            lines.append("| " + " | ".join(row) + f" | {errors} |")
        b, lt, m = s["burst"], s["late"], s["memory"]
        raw = b.get("raw")
        raw_text = (
            f" The raw pipeline on the same {b['requests']}: {raw['one_by_one_s']:.2f} s one by one, "
            f"{raw['batched_s']:.2f} s in batches of {raw['batch']}, a gain of {raw['gain']:.2f}x."
            if raw
            else ""
        )
        lines += [
            "",
            f"Burst: {b['requests']} at once; one by one on `none`: {b['sequential_on_none_s']:.2f} s.{raw_text} "
            f"Late arrival: sent {lt['sent_after_steps']} steps into a {lt['long_steps']}-step job; its wait is "
            f"its record's `gpu_wait`. Memory: peak RSS of the process tree, {m['concurrent']['full']} "
            f"concurrent requests against {m['concurrent']['batch']} (one full batch).",
            "",
            "| design | burst makespan s | burst / one by one | burst gain / raw gain | late: wait ms | "
            "late: one step ms | "
            "late: wait / step | late: arrived at step | late: joined at step | peak RSS 4 MiB | "
            "peak RSS 16 MiB | 16 / 4 | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in names:
            errors = b[d]["errors"] + lt[d]["errors"] + m[d]["errors"]
            lines.append(
                f"| {d} | {b[d]['makespan_s']:.2f} | {b[d]['over_sequential']:.2f} | "
                f"{_f(b[d].get('gain_over_raw_gain'), '.2f')} | {_f(lt[d]['wait_ms'])} | "
                f"{_f(lt[d]['step_ms'], '.1f')} | {_f(lt[d]['wait_over_step'], '.2f')} | "
                f"{_f(lt[d]['arrived_at_step'], '.1f')} | {_joined(lt[d]['joined_at_step'])} | "
                f"{m[d]['rss_batch_mb']:.0f} | "
                f"{m[d]['rss_full_mb']:.0f} | {m[d]['full_over_batch']:.3f} | {errors} |"
            )
    return "\n".join(lines)


def errors_of(result: dict[str, Any]) -> int:
    """Every failed request in the run (the exit status)."""
    total = 0
    for s in result["sections"]:
        designs = [d for d in DESIGNS if d in s["capacity"]]
        total += sum(s["capacity"][d]["errors"] for d in designs)
        total += sum(p[d]["errors"] for p in s["open_loop"].values() for d in designs)
        total += s["burst"]["sequential_errors"]
        total += sum(s[k][d]["errors"] for k in ("burst", "late", "memory") for d in designs)
    return total


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
    parser.add_argument("--designs", default=",".join(DEFAULT_DESIGNS),
                        help=f"comma-separated, of {', '.join(DESIGNS)} (none is required)")  # fmt: skip
    parser.add_argument("--size", type=int, default=None, help="pixels a side (default: the model's, 64 for a folder)")
    parser.add_argument("--steps", type=int, default=None, help="steps a request (default: 8 quick, else 20)")
    parser.add_argument("--loads", default=None, help="open-loop loads, fractions of 100 %% (default 0.5,0.8,0.95)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    designs = tuple(d for d in args.designs.split(",") if d)
    if "none" not in designs or not set(designs) <= set(DESIGNS):
        parser.error(f"--designs: none and any of {', '.join(DESIGNS)}")
    if args.model not in (None, "default") and not args.model.startswith("sim:") and not Path(args.model).is_dir():
        parser.error("--model is default, a sim:... spec or a model folder")
    plan = QUICK if args.quick else FULL
    if args.requests:
        plan = dataclasses.replace(plan, open_requests=args.requests)
    if args.loads:
        plan = dataclasses.replace(plan, loads=tuple(float(x) for x in args.loads.split(",")))
    result = run(args.quick, args.model, plan, designs, args.load_base, args.size, args.steps)
    print(render(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if errors_of(result) == 0 and finite_figures(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The open-loop benchmark's parts: its designs and plan, the models it runs, the async client that fires
a schedule and the late arrival, and the raw pipeline's burst (``bench.openloop`` re-exports them)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from bench import loadgen
from bench.__main__ import Raw, Server
from bench.stats import Shot, late_figures

BATCH = 4
DESIGNS: dict[str, tuple[str, ...]] = {
    "none": ("--max-batch-size", "1", "--step-joining", "off"),
    "job": ("--max-batch-size", str(BATCH), "--step-joining", "off"),
    "step": ("--max-batch-size", str(BATCH), "--step-joining", "on"),
}
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


# --- the async client --------------------------------------------------------------------------------


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

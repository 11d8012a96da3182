"""What step-level joining can buy in principle: both batching designs as an ideal queue, no server.

    python -m bench.queue_model [--requests 200000]

A discrete-event model of one device under Poisson arrivals of one-image requests of ``steps``
steps, where one denoising step of a batch of b images takes ``t1 * (1 + alpha * (b - 1))``:

- **job**: when the device is free, the first ``batch`` waiting requests run together to the end
  (job-level batching, ``--step-joining off``);
- **step**: at every step boundary, waiting requests join the running loop up to ``batch`` images,
  and each leaves when its own steps are done (``--step-joining on``).

No overheads at all (no encode, no decode, no hand-off): the best either design could do. The
loads are fractions of the job design's saturated rate (``bench.openloop --load-base job``) and of
the one-by-one rate (its default base). ``alpha`` is the batch's marginal cost: 0.49 for the
default model at 64 px on the 2-core CPU (raw pipeline, 8 one by one against batches of 4: a gain of
1.63x), about 0.45 for the simulated device at its default ``batch_cost`` 0.6 (its ``cpu_ms`` is
paid once per step), 0.05 for a device on which batching is almost free. The table gives step /
job latency percentiles at each point; issue 19's target is p99 <= 0.7 at 80 % load.
"""

from __future__ import annotations

import argparse
import random
from typing import Callable, Sequence

Cost = Callable[[int], float]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear between ranks, as ``bench.probe.pct``."""
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def poisson(rate: float, n: int, seed: int = 1) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def job_level(arrivals: Sequence[float], steps: int, cost: Cost, batch: int) -> list[float]:
    """Latency of each request (in arrival order) under job-level batching."""
    latency: list[float] = []
    queue: list[float] = []
    now, i, n = 0.0, 0, len(arrivals)
    while i < n or queue:
        if not queue:
            now = max(now, arrivals[i])
        while i < n and arrivals[i] <= now:
            queue.append(arrivals[i])
            i += 1
        job, queue = queue[:batch], queue[batch:]
        now += steps * cost(len(job))
        latency += [now - a for a in job]
    return latency


def step_level(arrivals: Sequence[float], steps: int, cost: Cost, batch: int) -> list[float]:
    """Latency of each request (in finishing order) under step-level joining."""
    latency: list[float] = []
    queue: list[float] = []
    members: list[list[float]] = []  # [arrival, steps left]
    now, i, n = 0.0, 0, len(arrivals)
    while i < n or queue or members:
        if not queue and not members:
            now = max(now, arrivals[i])
        while i < n and arrivals[i] <= now:
            queue.append(arrivals[i])
            i += 1
        while queue and len(members) < batch:
            members.append([queue.pop(0), steps])
        now += cost(len(members))
        for m in members:
            m[1] -= 1
        latency += [now - m[0] for m in members if m[1] == 0]
        members = [m for m in members if m[1] > 0]
    return latency


def ratios(
    t1: float, alpha: float, steps: int, load: float, base: str, batch: int = 4, requests: int = 200_000
) -> dict[str, float]:
    """Step / job latency at p50, p95 and p99; ``load`` of the ``job`` or ``none`` (one by one) rate."""

    def cost(b: int) -> float:
        return t1 * (1 + alpha * (b - 1))

    capacity = batch / (steps * cost(batch)) if base == "job" else 1 / (steps * cost(1))
    arrivals = poisson(load * capacity, requests)
    job, step = job_level(arrivals, steps, cost, batch), step_level(arrivals, steps, cost, batch)
    return {f"p{round(q * 100)}": percentile(step, q) / percentile(job, q) for q in (0.5, 0.95, 0.99)}


CASES = (
    ("default model, 64 px, 20 steps (alpha 0.49)", 0.0084, 0.49, 20),
    ("simulated device, 4 steps (alpha 0.45)", 0.020, 0.45, 4),
    ("batching almost free, 20 steps (alpha 0.05)", 0.0084, 0.05, 20),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args(argv)
    print("| device | 100 % load = | load | p50 step / job | p95 | p99 |")
    print("|---|---|---|---|---|---|")
    for name, t1, alpha, steps in CASES:
        for base in ("job", "none"):
            for load in (0.5, 0.8, 0.95):
                r = ratios(t1, alpha, steps, load, base, requests=args.requests)
                print(
                    f"| {name} | {base} rate | {round(load * 100)} % | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} |"
                )


if __name__ == "__main__":
    main()

"""A fair share of the GPU: light users' first requests behind one heavy user's queue (issue 19, section 6).

    python -m bench.fairness [--heavy 50] [--light 3] [--steps 8] [--json PATH]

One app server (the default model at 64 px, default batching) with room for the heavy user's whole
queue (``--concurrency``, ``--queue-size`` and ``--max-waiting-per-user`` raised past ``--heavy``).
One ``gradio_client`` client (one session: one user) submits ``--heavy`` requests at once; once
they wait, ``--light`` other clients (a user each) send one request each, a second apart. For each
light request the benchmark reads, from the info records:

- its wait for the GPU (``durations_ms.gpu_wait``) and its whole latency;
- **jobs before it**: the requests that entered the GPU (``timings.infer_start``) after it was
  ready to (``timings.gpu_wait_start``) and before it did -- the target is at most one per other
  active user (the heavy one and the light ones still waiting), however long the heavy queue;
- the heavy requests still waiting when it arrived: what plain FIFO would have put ahead of it.

The figures are counts and a ratio to the step time, not pass/fail thresholds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import Server


def _request(prompt: str, seed: int, steps: int) -> dict[str, Any]:
    return dict(
        prompt=prompt,
        negative_prompt="",
        seed=seed,
        randomize_seed=False,
        width=64,
        height=64,
        num_inference_steps=steps,
        guidance_scale=7.5,
        num_images=1,
        api_name="/generate",
    )


def jobs_before(light: dict[str, Any], others: list[dict[str, Any]]) -> int:
    """Requests that entered the GPU after ``light`` was ready to, and before it did."""
    ready, entered = light["timings"]["gpu_wait_start"], light["timings"]["infer_start"]
    return sum(1 for o in others if ready < o["timings"]["infer_start"] < entered)


def waiting_at(t: float, infos: list[dict[str, Any]]) -> int:
    """Requests in ``infos`` that were waiting for the GPU at time ``t``."""
    return sum(1 for i in infos if i["timings"]["gpu_wait_start"] <= t < i["timings"]["infer_start"])


def run(heavy: int, light: int, steps: int) -> dict[str, Any]:
    from gradio_client import Client

    room = str(heavy + light + 8)
    flags = ("--concurrency", room, "--queue-size", room, "--max-waiting-per-user", room)
    with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp:
        server = Server("gated", Path(tmp), *flags)
        try:
            warm = Client(server.url, verbose=False)
            warm.predict(**_request("warm up", 0, steps))
            heavy_client = Client(server.url, verbose=False)
            jobs = [heavy_client.submit(**_request(f"heavy {k}", k, steps)) for k in range(heavy)]
            time.sleep(2.0)  # they are all in line
            light_infos: list[dict[str, Any]] = []
            lock = threading.Lock()

            def one(k: int) -> None:
                _, info = Client(server.url, verbose=False).predict(**_request(f"light {k}", 1000 + k, steps))
                with lock:
                    light_infos.append(info)

            threads = []
            for k in range(light):
                threads.append(threading.Thread(target=one, args=(k,), name=f"light-{k}"))
                threads[-1].start()
                time.sleep(1.0)
            for t in threads:
                t.join()
            heavy_infos = [job.result(timeout=600)[1] for job in jobs]
        finally:
            server.close()
    everyone = heavy_infos + light_infos
    step_ms = statistics.median(i["durations_ms"]["inference"] / i["num_inference_steps"] for i in everyone)
    rows = []
    for info in sorted(light_infos, key=lambda i: i["timings"]["gpu_wait_start"]):
        others = [i for i in everyone if i is not info]
        rows.append(
            {
                "request_id": info["request_id"],
                "jobs_before": jobs_before(info, others),
                "heavy_waiting_at_arrival": waiting_at(info["timings"]["gpu_wait_start"], heavy_infos),
                "other_active_users": 1
                + waiting_at(info["timings"]["gpu_wait_start"], [i for i in light_infos if i is not info]),
                "gpu_wait_ms": round(info["durations_ms"]["gpu_wait"], 1),
                "total_ms": round(info["durations_ms"]["total"], 1),
                "batching": info.get("batching"),
            }
        )
    heavy_total = [i["durations_ms"]["total"] for i in heavy_infos]
    return {
        "heavy": heavy,
        "light": light,
        "steps": steps,
        "step_ms_median": round(step_ms, 1),
        "light_requests": rows,
        "heavy_total_ms_p50": round(statistics.median(heavy_total), 1),
        "heavy_total_ms_max": round(max(heavy_total), 1),
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"Fair share: {result['heavy']} heavy requests from one user queued at once, then {result['light']} "
        f"light users, one request each, a second apart (64 px, {result['steps']} steps; one step "
        f"{result['step_ms_median']} ms).",
        "",
        "| light request | jobs that entered the GPU before it | other active users | heavy requests waiting "
        "when it arrived (FIFO would run these first) | GPU wait ms | total ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["light_requests"]:
        lines.append(
            f"| {r['request_id'][:8]} | {r['jobs_before']} | {r['other_active_users']} | "
            f"{r['heavy_waiting_at_arrival']} | {r['gpu_wait_ms']:.0f} | {r['total_ms']:.0f} |"
        )
    lines += [
        "",
        f"Heavy requests: total p50 {result['heavy_total_ms_p50']:.0f} ms, max {result['heavy_total_ms_max']:.0f} ms.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heavy", type=int, default=50)
    parser.add_argument("--light", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.heavy, args.light, args.steps)
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

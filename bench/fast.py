"""The serving layer against a simulated fast device (issue 17): is the server what limits it?

    python -m bench.fast [--quick] [--client gradio|async|both] [--profiles a,b] [--clients 8,32] [--fetch]
                         [--model-side process,thread] [--json PATH]

For each profile (``--model sim:...``, see ``pipeline/engine/model/simulated.py``) it measures, in one run:

- the device's own rate: the simulated model called back to back on one thread, no server;
- the app's rate: ``python app.py --model sim:...`` (``--max-batch-size 1``, like for like) served to
  8 and 32 concurrent callers (``bench.loadgen``: ``--client gradio``, gradio_client threads, or
  ``async``, Gradio's queue protocol from one asyncio loop; ``both`` runs them in ABBA order on the
  same server and gives a row to each);
- app / raw, and the server's CPU per request, counted over the whole process tree;
- the load generator's own CPU per request (this process, every thread): on a small machine the
  callers and the server share the cores, so this says whether the client side is what limits;
- each model side (``--model-side process``, the default, and ``thread``) on its own server: the
  model's inference time under load over its time alone (``/metrics`` ``inference_seconds``), and
  the peak resident memory of the whole process tree;
- on the SD-Turbo-like profile, the latency of a request that validation rejects (width 65), alone
  and while 16 callers generate: it should be answered at join time, not behind the handler slots.

No thresholds: the figures go to the table (and ``--json``). A round is ``max(64, 4 x clients)``
requests and at least ROUND_SECONDS: on the null device 64 requests take under a second, and the
server's CPU per request over such a window swung 13-20 ms between rounds against 12-13 ms over
ten seconds (one server, alternated). ``--quick``: two profiles, 8 clients, 3 requests per client
and at least QUICK_ROUND_SECONDS, the default model side only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import loadgen
from bench.harness import Server
from bench.probe import light_request, pct

PROFILES: dict[str, str] = {
    "null": "sim:cpu_ms=0,dev_ms=0,decode_ms=0,size=512,steps=1",
    "sd-turbo-like": "sim:cpu_ms=5,dev_ms=15,decode_ms=8,size=512,steps=1",
    "launch-bound": "sim:cpu_ms=8,dev_ms=4,decode_ms=4,size=512,steps=4",
    "sd15-like": "sim:cpu_ms=5,dev_ms=12,decode_ms=15,size=512,steps=25",
    "sdxl-turbo-like-1024": "sim:cpu_ms=8,dev_ms=45,decode_ms=30,size=1024,steps=1",
}
QUICK = ("null", "sd-turbo-like")
ROUND_SECONDS = 8.0  # the least a measured round lasts (full run)
QUICK_ROUND_SECONDS = 3.0
# gradio_client threads are not what limits these runs: 5-13 ms of caller CPU per request against the
# server's 43-64 ms, and the asyncio client (20-52 % less) moves the app's rate only within the noise
# (docs/performance-history.md, "Load generator: gradio_client threads or one asyncio client"); so the default
# stays the client a user would use, and the published baseline stays comparable.
DEFAULT_CLIENT = "gradio"
SIDES = ("process", "thread")
REJECT_PROFILE, REJECT_CLIENTS = "sd-turbo-like", 16


def inference_seconds(url: str) -> tuple[float, float]:
    """(sum, count) of the app's ``inference_seconds`` histogram: time in the model, per job."""
    import httpx

    values = {}
    for line in httpx.get(url + "metrics", timeout=10).text.splitlines():
        if line.startswith(("inference_seconds_sum", "inference_seconds_count")):
            name, value = line.split()
            values[name] = float(value)
    return values["inference_seconds_sum"], values["inference_seconds_count"]


def mean_inference_ms(url: str, fn: Any) -> float | None:
    before = inference_seconds(url)
    fn()
    after = inference_seconds(url)
    jobs = after[1] - before[1]
    return (after[0] - before[0]) / jobs * 1000 if jobs else None


def rejection_latency(server: Server, sim: Any, n: int) -> dict[str, Any]:
    """p50/p99 (ms) of a request validation rejects: alone, then while REJECT_CLIENTS callers generate.

    The callers run in a process of their own (``python -m bench.loadgen``), so that their SSE
    parsing does not take this process's GIL from the probe: the figure is the server's answer time.
    """
    import subprocess
    import sys

    import httpx

    from bench.probe import api_fn_index

    index = api_fn_index(server.url)
    with httpx.Client(timeout=60) as http:
        light_request(server.url, index, http)  # warm the connection
        idle = [light_request(server.url, index, http) for _ in range(n)]
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.loadgen",
                server.url,
                "--client",
                "async",
                "--clients",
                str(REJECT_CLIENTS),
                "--seconds",
                "600",
                "--size",
                str(sim.size),
                "--steps",
                str(sim.steps),
            ],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(3.0)  # the callers start and fill the handler slots
            busy = [light_request(server.url, index, http) for _ in range(n)]
        finally:
            load.terminate()
            load.wait(timeout=30)
    idle_p, busy_p = pct(idle), pct(busy)
    return {
        "clients": REJECT_CLIENTS,
        "idle_p50_ms": idle_p["p50"],
        "idle_p99_ms": idle_p["p99"],
        "load_p50_ms": busy_p["p50"],
        "load_p99_ms": busy_p["p99"],
        "load_p99_minus_idle_p99_ms": busy_p["p99"] - idle_p["p99"],
    }


def device_rate(spec: str, n: int) -> float | None:
    """Images per second of the simulated device alone (its own arithmetic, one image at a time);
    None for the null device, which takes no time at all."""
    import threading

    from pipeline.engine.model.simulated import SimSpec, SimulatedModel
    from pipeline.protocol import InferenceJob

    sim = SimSpec.parse(spec)
    if sim.cpu_ms == sim.dev_ms == sim.decode_ms == 0:
        return None
    model = SimulatedModel(sim, spec)
    job = InferenceJob("raw", ("p",), ("",), (0,), sim.size, sim.size, sim.steps, 0.0)
    model.generate(job, threading.Event(), lambda *_: None)  # its pictures made once, as in the app
    t0 = time.perf_counter()
    for _ in range(n):
        model.generate(job, threading.Event(), lambda *_: None)
    elapsed = time.perf_counter() - t0
    return n / elapsed if elapsed > 0 else None


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its children (a model or encoder process counts)."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def one_round(
    server: Server, sim: Any, clients: int, n: int, client: str, fetch: bool, min_seconds: float | None = None
) -> dict[str, Any]:
    """One closed-loop round of ``n`` requests, and at least ``min_seconds`` of them; the server's CPU
    over the same window as the client's."""
    marks: dict[str, float] = {}
    result = loadgen.run(
        server.url,
        clients,
        client=client,
        n=n,
        min_seconds=min_seconds,
        size=sim.size,
        steps=sim.steps,
        fetch=fetch,
        on_start=lambda: marks.update(cpu0=tree_cpu_seconds(server.proc.pid)),
    )
    return {"result": result, "server_cpu": tree_cpu_seconds(server.proc.pid) - marks["cpu0"]}


def handoff_ms(infos: list[dict[str, Any]]) -> dict[str, float]:
    """The hand-off between jobs, in ms: from one job's end on the model side (its decode done) to the
    next job's start there (its entry into the loop, or its call), over consecutive jobs whose
    second was already waiting when the first ended: the time the device sat idle with work in line.
    From the info records' timings (``infer_start`` / ``infer_end`` on the model side's clock,
    ``received`` on the server's: one machine, one clock)."""
    jobs = sorted((i["timings"] for i in infos if "timings" in i), key=lambda t: t["infer_start"])
    gaps = [
        (b["infer_start"] - a["infer_end"]) * 1000 for a, b in zip(jobs, jobs[1:]) if b["received"] <= a["infer_end"]
    ]
    return pct(gaps) if gaps else {}


def app_rate(
    server: Server,
    spec: str,
    clients: int,
    n: int,
    client: str = DEFAULT_CLIENT,
    fetch: bool = False,
    min_seconds: float | None = None,
) -> dict[str, dict[str, Any]]:
    """The app's rate under ``clients`` callers, one row per kind of client: one round each, or with
    ``client="both"`` four rounds in ABBA order (gradio, async, async, gradio), summed per kind."""
    from pipeline.engine.model.simulated import SimSpec

    sim = SimSpec.parse(spec)
    kinds = ("gradio", "async") if client == "both" else (client,)
    for kind in kinds:  # warm every client path
        loadgen.run(server.url, clients, client=kind, n=clients, size=sim.size, steps=sim.steps, fetch=fetch)
    order = ("gradio", "async", "async", "gradio") if client == "both" else kinds
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for kind in order:
        rounds[kind].append(one_round(server, sim, clients, n, kind, fetch, min_seconds))
    rows = {}
    for kind, measured in rounds.items():
        results: list[loadgen.LoadResult] = [m["result"] for m in measured]
        done = sum(r.count for r in results)
        sent = done + sum(r.errors for r in results)
        seconds = sum(r.seconds for r in results)
        server_cpu = sum(m["server_cpu"] for m in measured)
        client_cpu = sum(r.client_cpu_seconds for r in results)
        latency = pct([o.latency_ms for r in results for o in r.outcomes if o.ok]) if done else {}
        gaps = handoff_ms([info for r in results for info in r.infos])
        rows[kind] = {
            "images_per_second": sum(r.images_per_second * r.seconds for r in results) / seconds,
            "server_cpu_ms_per_request": server_cpu / max(1, done) * 1000,
            "client_cpu_ms_per_request": client_cpu / max(1, sent) * 1000,
            # of all the CPU this run spent (callers + server), the callers' share; and how busy the
            # machine's cores were: near 1, the callers' CPU is CPU the server did not get
            "client_cpu_share": client_cpu / (client_cpu + server_cpu) if client_cpu + server_cpu > 0 else None,
            "cores_busy": (client_cpu + server_cpu) / (seconds * (psutil.cpu_count() or 1)),
            "latency_p50_ms": latency.get("p50"),
            "latency_p99_ms": latency.get("p99"),
            # the device idle between jobs: one job's end to the next waiting one's start on the model side
            "handoff_p50_ms": gaps.get("p50"),
            "handoff_p99_ms": gaps.get("p99"),
            "requests": done,
            "errors": sent - done,
            "rounds": len(results),
            "fetch": fetch,
            "error_messages": [m for r in results for m in r.error_messages][:5],
        }
    return rows


def run(
    quick: bool,
    client: str = DEFAULT_CLIENT,
    profiles: tuple[str, ...] | None = None,
    client_counts: tuple[int, ...] | None = None,
    fetch: bool = False,
    sides: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    from pipeline.engine.model.simulated import POOL, SimSpec

    names = profiles or (QUICK if quick else tuple(PROFILES))
    client_counts = client_counts or ((8,) if quick else (8, 32))
    sides = sides or (SIDES[:1] if quick else SIDES)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fast-"))
    rows, servers = [], []
    for name in names:
        spec = PROFILES[name]
        sim = SimSpec.parse(spec)
        raw = device_rate(spec, 20 if quick else 60)
        for side in sides:
            server = Server(
                "gated",
                tmp / f"{name}-{side}",
                "--model",
                spec,
                "--model-side",
                side,
                "--max-batch-size",
                "1",
                "--concurrency",
                "64",
                "--queue-size",
                "256",
            )
            try:
                # every picture the device hands out made once (its pool by seed), so none lands in a timing
                loadgen.run(server.url, 1, client="async", n=POOL, size=sim.size, steps=sim.steps)
                idle_ms = mean_inference_ms(
                    server.url,
                    lambda: loadgen.run(
                        server.url, 1, client="async", n=4 if quick else 12, size=sim.size, steps=sim.steps
                    ),
                )
                for clients in client_counts:
                    n = 3 * clients if quick else max(64, 4 * clients)
                    min_seconds = QUICK_ROUND_SECONDS if quick else ROUND_SECONDS
                    measured: dict[str, Any] = {}

                    def load(clients: int = clients, n: int = n, out: dict[str, Any] = measured) -> None:
                        out["ms"] = mean_inference_ms(
                            server.url,
                            lambda: out.update(rows=app_rate(server, spec, clients, n, client, fetch, min_seconds)),
                        )

                    _, peak = server.peak_rss(load)
                    load_ms = measured["ms"]
                    for kind, app in measured["rows"].items():
                        ratio = app["images_per_second"] / raw if raw else None
                        rows.append(
                            {
                                "profile": name,
                                "spec": spec,
                                "model_side": side,
                                "clients": clients,
                                "client": kind,
                                "device_images_per_second": raw,
                                **app,
                                "app_over_raw": ratio,
                                "inference_idle_ms": idle_ms,
                                "inference_load_ms": load_ms,
                                "inference_load_over_idle": load_ms / idle_ms if idle_ms and load_ms else None,
                                "peak_tree_rss_mb": peak / 2**20,
                            }
                        )
                entry: dict[str, Any] = {"profile": name, "model_side": side}
                if name == REJECT_PROFILE or (quick and name == names[-1]):
                    entry["rejected"] = rejection_latency(server, sim, 20 if quick else 60)
                servers.append(entry)
            finally:
                server.close()
    shutil.rmtree(tmp, ignore_errors=True)  # every server's images: gigabytes on the null device
    return {"quick": quick, "cores": psutil.cpu_count(), "client": client, "rows": rows, "servers": servers}


def render(result: dict[str, Any]) -> str:
    client = result.get("client", "gradio")
    callers = {
        "gradio": "gradio_client callers",
        "async": "one asyncio caller loop",
        "both": "gradio_client threads and one asyncio loop, ABBA",
    }[client]
    lines = [
        f"Fast device ({'quick' if result['quick'] else 'full'}, {result['cores']} cores): "
        f"app = this app (`--max-batch-size 1`), 512 px unless named; {callers}",
        "",
        "| profile | model side | clients | client | device's own rate img/s | through the app img/s "
        "| app / raw | server CPU per request ms (process tree) | client CPU per request ms "
        "| model inference under load / idle | hand-off p50 / p99 ms | peak RSS of the process tree MiB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        raw = "unlimited" if r["device_images_per_second"] is None else f"{r['device_images_per_second']:.1f}"
        ratio = "-" if r["app_over_raw"] is None else f"{r['app_over_raw']:.2f}"
        own = "-" if r.get("client_cpu_ms_per_request") is None else f"{r['client_cpu_ms_per_request']:.1f}"
        slow = r.get("inference_load_over_idle")
        lines.append(
            f"| {r['profile']} | {r.get('model_side', 'thread')} | {r['clients']} | "
            f"{r.get('client', 'gradio')} | {raw} | {r['images_per_second']:.1f} | {ratio} | "
            f"{r['server_cpu_ms_per_request']:.0f} | {own} | {'-' if slow is None else f'{slow:.2f}'} | "
            f"{_ms(r.get('handoff_p50_ms'))} / {_ms(r.get('handoff_p99_ms'))} | "
            f"{r.get('peak_tree_rss_mb', 0):.0f} | {r['errors']} |"
        )
    rejected = [s for s in result.get("servers", []) if "rejected" in s]
    if rejected:
        lines += [
            "",
            "| rejected request (width 65) | model side | idle p50 / p99 ms | "
            "while 16 callers generate p50 / p99 ms | p99 load - idle ms |",
            "|---|---|---|---|---|",
        ]
        for s in rejected:
            j = s["rejected"]
            lines.append(
                f"| {s['profile']} | {s['model_side']} | {j['idle_p50_ms']:.1f} / {j['idle_p99_ms']:.1f} | "
                f"{j['load_p50_ms']:.1f} / {j['load_p99_ms']:.1f} | {j['load_p99_minus_idle_p99_ms']:.1f} |"
            )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--client",
        choices=(*loadgen.CLIENTS, "both"),
        default=DEFAULT_CLIENT,
        help="the load generator: gradio_client threads, one asyncio loop, or both in ABBA order",
    )
    parser.add_argument(
        "--profiles",
        type=lambda v: tuple(v.split(",")),
        default=None,
        help=f"comma-separated, of {', '.join(PROFILES)}",
    )
    parser.add_argument(
        "--clients",
        type=lambda v: tuple(int(c) for c in v.split(",")),
        default=None,
        help="comma-separated caller counts (default 8, or 8,32 in a full run)",
    )
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="download every image, as gradio_client does by default (the benchmark's callers don't)",
    )
    parser.add_argument(
        "--model-side",
        type=lambda v: tuple(v.split(",")),
        default=None,
        help="comma-separated model sides to serve from (default process,thread; quick: process)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.profiles and not set(args.profiles) <= set(PROFILES):
        parser.error(f"unknown profile in {args.profiles}; choose from {', '.join(PROFILES)}")
    if args.model_side and not set(args.model_side) <= set(SIDES):
        parser.error(f"unknown model side in {args.model_side}; choose from {', '.join(SIDES)}")
    result = run(args.quick, args.client, args.profiles, args.clients, args.fetch, args.model_side)
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(r["errors"] == 0 and r["requests"] > 0 for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

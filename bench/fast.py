"""The serving layer against a simulated fast device (issue 17): is the server what limits it?

    python -m bench.fast [--quick] [--json PATH]

For each profile (``--model sim:...``, see ``pipeline/engine/simulated.py``) it measures, in one run:

- the device's own rate: the simulated model called back to back on one thread, no server;
- the app's rate: ``python app.py --model sim:...`` (``--max-batch-size 1``, like for like) served to
  8 and 32 concurrent ``gradio_client`` callers;
- app / raw, and the server's CPU per request, counted over the whole process tree.

No thresholds: the figures go to the table (and ``--json``). ``--quick``: two profiles, 8 clients.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.__main__ import Server
from bench.probe import predict_many

PROFILES: dict[str, str] = {
    "null": "sim:cpu_ms=0,dev_ms=0,decode_ms=0,size=512,steps=1",
    "sd-turbo-like": "sim:cpu_ms=5,dev_ms=15,decode_ms=8,size=512,steps=1",
    "launch-bound": "sim:cpu_ms=8,dev_ms=4,decode_ms=4,size=512,steps=4",
    "sd15-like": "sim:cpu_ms=5,dev_ms=12,decode_ms=15,size=512,steps=25",
    "sdxl-turbo-like-1024": "sim:cpu_ms=8,dev_ms=45,decode_ms=30,size=1024,steps=1",
}
QUICK = ("null", "sd-turbo-like")


def device_rate(spec: str, n: int) -> float | None:
    """Images per second of the simulated device alone (its own arithmetic, one image at a time);
    None for the null device, which takes no time at all."""
    import threading

    from pipeline.engine.simulated import SimSpec, SimulatedModel
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


def app_rate(server: Server, spec: str, clients: int, n: int) -> dict[str, Any]:
    from pipeline.engine.simulated import SimSpec

    sim = SimSpec.parse(spec)
    predict_many(server.url, clients, clients, size=sim.size, steps=sim.steps)  # warm every client path
    cpu0, t0 = tree_cpu_seconds(server.proc.pid), time.perf_counter()
    infos, errors = predict_many(server.url, n, clients, size=sim.size, steps=sim.steps)
    elapsed, cpu = time.perf_counter() - t0, tree_cpu_seconds(server.proc.pid) - cpu0
    return {"images_per_second": len(infos) / elapsed, "server_cpu_ms_per_request": cpu / max(1, len(infos)) * 1000,
            "requests": len(infos), "errors": len(errors)}


def run(quick: bool) -> dict[str, Any]:
    names = QUICK if quick else tuple(PROFILES)
    client_counts = (8,) if quick else (8, 32)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fast-"))
    rows = []
    for name in names:
        spec = PROFILES[name]
        raw = device_rate(spec, 20 if quick else 60)
        server = Server("gated", tmp / name, "--model", spec, "--max-batch-size", "1", "--concurrency", "64",
                        "--queue-size", "256")
        try:
            for clients in client_counts:
                n = 24 if quick else max(64, 4 * clients)
                app = app_rate(server, spec, clients, n)
                ratio = app["images_per_second"] / raw if raw else None
                rows.append({"profile": name, "spec": spec, "clients": clients, "device_images_per_second": raw,
                             **app, "app_over_raw": ratio})
        finally:
            server.close()
    return {"quick": quick, "cores": psutil.cpu_count(), "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [f"Fast device ({'quick' if result['quick'] else 'full'}, {result['cores']} cores): "
             "app = this app (`--max-batch-size 1`), 512 px unless named; gradio_client callers",
             "", "| profile | clients | device's own rate img/s | through the app img/s | app / raw "
             "| server CPU per request ms | errors |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        raw = "unlimited" if r["device_images_per_second"] is None else f"{r['device_images_per_second']:.1f}"
        ratio = "-" if r["app_over_raw"] is None else f"{r['app_over_raw']:.2f}"
        lines.append(f"| {r['profile']} | {r['clients']} | {raw} | {r['images_per_second']:.1f} | {ratio} | "
                     f"{r['server_cpu_ms_per_request']:.0f} | {r['errors']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.quick)
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(r["errors"] == 0 and r["requests"] > 0 for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

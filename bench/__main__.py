"""The benchmark: every figure a ratio against a reference measured in the same run.

    python -m bench [--quick] [--device cpu|cuda] [--json bench/results/latest.json]

Servers run as subprocesses (``bench.servers``), the raw pipeline in its own subprocess
(``bench.raw``); this process only generates load (``gradio_client`` threads) and probes (httpx).
Absolute times are printed for context; the judged figures are ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.probe import light_request, pct, predict_many, sample_health

ROOT = Path(__file__).resolve().parent.parent


class Server:
    """One app design in a subprocess on a free port, with an RSS sampler."""

    def __init__(self, design: str, tmp: Path, *extra: str, start: bool = True) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp / f"gradio-{design}"), "HF_HUB_OFFLINE": "1",
               "T2I_OUTPUT_DIR": str(tmp / f"out-{design}")}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.servers", "--design", design, "--port", str(self.port), *extra],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.ready_after = 0.0
        if start:
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                break
        self.ready_after = time.monotonic() - self.started
        self._peak = 0
        self._sampling = threading.Event()
        threading.Thread(target=self._sample, name="rss-sampler", daemon=True).start()

    def _sample(self) -> None:
        while self.proc.poll() is None:
            if self._sampling.is_set():
                try:
                    self._peak = max(self._peak, self.ps.memory_info().rss)
                except psutil.Error:
                    return
            time.sleep(0.01)

    def peak_rss(self, fn: Any) -> tuple[Any, int]:
        self._peak = self.ps.memory_info().rss
        self._sampling.set()
        try:
            result = fn()
        finally:
            self._sampling.clear()
        return result, self._peak

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def raw_images_per_second(size: int, steps: int, n: int, threads: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "bench.raw", "--size", str(size), "--steps", str(steps), "--n", str(n),
         "--threads", str(threads)],
        cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return float(json.loads(out.stdout.strip().splitlines()[-1])["images_per_second"])


def busy_fraction(infos: list[dict[str, Any]]) -> float:
    spans = sorted((i["timings"]["infer_start"], i["timings"]["infer_end"]) for i in infos)
    busy = sum(b - a for a, b in spans)
    return busy / (spans[-1][1] - spans[0][0])


def mean_inference(infos: list[dict[str, Any]]) -> float:
    return statistics.mean(i["timings"]["infer_end"] - i["timings"]["infer_start"] for i in infos)


def overhead(server: Server, sizes: list[int], steps: int, n: int, clients: int, threads: int) -> dict[str, Any]:
    rows = {}
    for size in sizes:
        raw_before = raw_images_per_second(size, steps, n, threads)
        idle, _ = predict_many(server.url, 3, 1, size=size, steps=steps)
        t0 = time.monotonic()
        infos, errors = predict_many(server.url, n, clients, size=size, steps=steps)
        app_ips = len(infos) / (time.monotonic() - t0)
        raw_after = raw_images_per_second(size, steps, n, threads)
        raw = (raw_before + raw_after) / 2
        rows[size] = {
            "raw_images_per_second": raw, "app_images_per_second": app_ips,
            "throughput_ratio": app_ips / raw, "gpu_busy_fraction": busy_fraction(infos),
            "inference_load_over_idle": mean_inference(infos) / mean_inference(idle),
            "errors": len(errors),
        }
    return rows


def responsiveness(server: Server, size: int, steps: int, clients: int, seconds: float, fn_index: int) -> dict[str, Any]:
    idle_health = sample_health(server.url, seconds / 2)
    idle_light = [light_request(server.url, fn_index) for _ in range(20)]
    stop = threading.Event()
    load = threading.Thread(target=lambda: predict_many(server.url, 10**6, clients, size=size, steps=steps, stop=stop))
    load.start()
    time.sleep(1.0)
    busy_health = sample_health(server.url, seconds)
    busy_light = [light_request(server.url, fn_index) for _ in range(20)]
    stop.set()
    load.join()
    return {
        "health_idle_ms": pct(idle_health), "health_load_ms": pct(busy_health),
        "light_idle_ms": pct(idle_light), "light_load_ms": pct(busy_light),
    }


def memory(server: Server, size: int, steps: int) -> dict[str, Any]:
    _, one = server.peak_rss(lambda: predict_many(server.url, 1, 1, size=size, steps=steps))
    _, sixteen = server.peak_rss(lambda: predict_many(server.url, 16, 16, size=size, steps=steps))
    return {"rss_1_mb": one / 2**20, "rss_16_mb": sixteen / 2**20, "rss_16_over_1": sixteen / one}


def design_row(server: Server, size: int, steps: int, n: int) -> dict[str, Any]:
    fn_index = fn_index_of(server.url)
    predict_many(server.url, 2, 1, size=size, steps=steps)  # warm
    stop = threading.Event()
    health: list[float] = []
    light: list[float] = []

    def probe() -> None:
        while not stop.is_set():
            health.extend(sample_health(server.url, 0.5))
            light.append(light_request(server.url, fn_index))

    prober = threading.Thread(target=probe)
    t0 = time.monotonic()
    prober.start()
    (infos, errors), peak = server.peak_rss(lambda: predict_many(server.url, n, 16, size=size, steps=steps))
    wall = time.monotonic() - t0
    stop.set()
    prober.join()
    return {"images_per_second": len(infos) / wall, "errors": len(errors), "health_p99_ms": pct(health)["p99"],
            "light_p99_ms": pct(light)["p99"], "peak_rss_mb": peak / 2**20, "error_sample": errors[:1]}


def naive_designs(tmp: Path, gated_row: dict[str, Any], size: int, steps: int, n: int, threads: int) -> dict[str, Any]:
    """The designs DESIGN.md warns against, on the same load; the servers start together, run one at a time."""
    rows = {"gated": gated_row}
    servers = {d: Server(d, tmp, "--torch-threads", str(threads), "--concurrency", "16", start=False)
               for d in ("whole_lock", "no_gate", "on_loop")}
    for server in servers.values():
        server.wait_ready()
    try:
        for design, server in servers.items():
            rows[design] = design_row(server, size, steps, n)
    finally:
        for server in servers.values():
            server.close()
    base = rows["gated"]
    for row in rows.values():
        row["throughput_vs_gated"] = row["images_per_second"] / base["images_per_second"]
        row["rss_vs_gated"] = row["peak_rss_mb"] / base["peak_rss_mb"]
    return rows


def cancel_cost(server: Server, size: int) -> dict[str, Any]:
    from gradio_client import Client

    def steps_total() -> float:
        text = httpx.get(server.url + "metrics", timeout=10).text
        return float(next(l.split()[1] for l in text.splitlines() if l.startswith("denoise_steps_total ")))

    a, b = Client(server.url, verbose=False), Client(server.url, verbose=False)
    start = steps_total()
    job_a = a.submit(prompt="long", randomize_seed=False, seed=1, width=size, height=size, num_inference_steps=100,
                     api_name="/generate")
    while steps_total() - start < 5:
        time.sleep(0.005)
    job_b = b.submit(prompt="next", randomize_seed=False, seed=2, width=size, height=size, num_inference_steps=5,
                     api_name="/generate")
    while httpx.get(server.url + "health").json()["gpu_queue_depth"] < 1:
        time.sleep(0.005)
    at_cancel = steps_total()
    cancelled_at = time.time()
    threading.Thread(target=job_a.cancel).start()
    _, info_b = job_b.result(timeout=120)
    after = steps_total() - at_cancel - info_b["steps_done"]
    return {"steps_after_cancel": after, "next_job_start_ms": (info_b["timings"]["infer_start"] - cancelled_at) * 1000}


def cold_start(server: Server) -> dict[str, Any]:
    """Process start to first image, on the freshly started main server."""
    predict_many(server.url, 1, 1, size=64, steps=20)
    return {"process_start_to_ready_s": server.ready_after,
            "process_start_to_first_image_s": time.monotonic() - server.started}


def fn_index_of(url: str) -> int:
    config = httpx.get(url + "config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")


def versions() -> dict[str, str]:
    import diffusers
    import gradio
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "gradio": gradio.__version__, "cpu": platform.processor() or platform.machine(),
            "cores": str(os.cpu_count())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and sizes (under 2 minutes)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="torch threads")
    args = parser.parse_args(argv)
    quick = args.quick
    sizes = [64] if quick else [64, 128, 256]
    n = 6 if quick else 24
    steps = 20
    results: dict[str, Any] = {"mode": "quick" if quick else "full", "versions": versions(), "steps": steps}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        server = Server("gated", tmp, "--torch-threads", str(args.threads), "--concurrency", "16")
        try:
            results["cold_start"] = cold_start(server)
            fn_index = fn_index_of(server.url)
            results["overhead"] = overhead(server, sizes, steps, n, clients=4, threads=args.threads)
            results["responsiveness"] = responsiveness(server, 64, steps, 4, 2.0 if quick else 6.0, fn_index)
            results["memory"] = memory(server, 64, steps)
            results["cancel"] = cancel_cost(server, 64)
            gated_row = design_row(server, 64, steps, 16 if quick else 48)
        finally:
            server.close()
        results["designs"] = naive_designs(tmp, gated_row, 64, steps, 16 if quick else 48, args.threads)
    results["seconds"] = time.monotonic() - started
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(render(results))
    return 0


def render(r: dict[str, Any]) -> str:
    v = r["versions"]
    lines = [f"Benchmark ({r['mode']}, {r['seconds']:.0f} s): {v['cores']} cores {v['cpu']}, torch {v['torch']}, "
             f"diffusers {v['diffusers']}, gradio {v['gradio']}, {r['steps']} steps", "",
             "| size | app / raw throughput | GPU section busy | inference under load / idle | raw img/s | app img/s |",
             "|---|---|---|---|---|---|"]
    for size, row in r["overhead"].items():
        lines.append(f"| {size} px | {row['throughput_ratio']:.3f} | {row['gpu_busy_fraction']:.3f} | "
                     f"{row['inference_load_over_idle']:.3f} | {row['raw_images_per_second']:.2f} | "
                     f"{row['app_images_per_second']:.2f} |")
    resp = r["responsiveness"]
    lines += ["", "| latency (ms) | idle p50 / p95 / p99 | under load p50 / p95 / p99 |", "|---|---|---|"]
    for name, key in (("/health", "health"), ("light queued event (rejected by validation)", "light")):
        idle, load = resp[f"{key}_idle_ms"], resp[f"{key}_load_ms"]
        lines.append(f"| {name} | {idle['p50']:.1f} / {idle['p95']:.1f} / {idle['p99']:.1f} | "
                     f"{load['p50']:.1f} / {load['p95']:.1f} / {load['p99']:.1f} |")
    m, c, cs = r["memory"], r["cancel"], r["cold_start"]
    lines += ["", f"Peak RSS: 1 request {m['rss_1_mb']:.0f} MiB, 16 concurrent {m['rss_16_mb']:.0f} MiB, "
              f"ratio **{m['rss_16_over_1']:.3f}**. Cancel: **{c['steps_after_cancel']:.0f}** steps after the cancel, "
              f"next job started {c['next_job_start_ms']:.0f} ms later. Cold start: ready in "
              f"{cs['process_start_to_ready_s']:.1f} s, first image at {cs['process_start_to_first_image_s']:.1f} s.",
              "", "| design (16 concurrent, 64 px) | throughput vs gated | /health p99 ms | light p99 ms | peak RSS vs gated | errors |",
              "|---|---|---|---|---|---|"]
    for design, row in r["designs"].items():
        lines.append(f"| {design} | {row['throughput_vs_gated']:.3f} | {row['health_p99_ms']:.1f} | "
                     f"{row['light_p99_ms']:.1f} | {row['rss_vs_gated']:.3f} | {row['errors']} |")
    return "\n".join(lines)


def finite_figures(r: Any) -> bool:
    """Every number in the results is finite (used by the test of --quick)."""
    if isinstance(r, dict):
        return all(finite_figures(v) for v in r.values())
    if isinstance(r, list):
        return all(finite_figures(v) for v in r)
    if isinstance(r, float):
        return math.isfinite(r)
    return True


if __name__ == "__main__":
    raise SystemExit(main())

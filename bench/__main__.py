"""The benchmark: every figure a ratio against a reference measured in the same run.

    python -m bench [--quick] [--device cpu|cuda] [--json bench/results/latest.json]
    python -m bench --backend ray [--quick]     # Ray Serve: 2 replicas vs 1 vs LocalAdapter (bench.scale)

Servers run as subprocesses (``bench.servers``), the raw pipeline in its own subprocess
(``bench.raw``); this process only generates load (``gradio_client`` threads) and probes (httpx).
Absolute times are printed for context; the judged figures are ratios.
"""

from __future__ import annotations

import argparse
import importlib.metadata
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

from bench.probe import light_request, pct, predict_many, sample_health, steady_rate
from bench.servers import ONE_ADDRESS

ROOT = Path(__file__).resolve().parent.parent


class Server:
    """One app design in a subprocess on a free port, with an RSS sampler."""

    def __init__(self, design: str, tmp: Path, *extra: str, start: bool = True) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, **ONE_ADDRESS, "HF_HUB_OFFLINE": "1", "T2I_OUTPUT_DIR": str(tmp / f"out-{design}")}
        if design != "gated":  # the app itself keeps Gradio's cache in its output folder, as users run it
            env["GRADIO_TEMP_DIR"] = str(tmp / f"gradio-{design}")
        else:
            env.pop("GRADIO_TEMP_DIR", None)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.servers", "--design", design, "--port", str(self.port), *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
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

    def tree_rss(self, procs: list[psutil.Process] | None = None) -> int:
        """Resident memory of the server and every process under it (a model process counts)."""
        total = 0
        for proc in procs if procs is not None else self.tree():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.Error:
            return [self.ps]

    def _sample(self) -> None:
        """Every 10 ms while sampling. Listing the tree walks /proc (0.8 ms of CPU, 8 % of a core at
        this rate, taken from the server on a 2-core machine), so the list is refreshed every 0.5 s;
        reading each process's RSS is 10 us."""
        procs, listed = self.tree(), time.monotonic()
        while self.proc.poll() is None:
            if self._sampling.is_set():
                if time.monotonic() - listed > 0.5:
                    procs, listed = self.tree(), time.monotonic()
                try:
                    self._peak = max(self._peak, self.tree_rss(procs))
                except psutil.Error:
                    return
            time.sleep(0.01)

    def peak_rss(self, fn: Any) -> tuple[Any, int]:
        self._peak = self.tree_rss()
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


class Raw:
    """The raw pipeline in its own persistent process (``bench.raw``), run on demand between app rounds."""

    def __init__(self, threads: int, device: str, model: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.raw", "--threads", str(threads), "--device", device, "--model", model],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the raw pipeline process died")
        return json.loads(line)

    def wait_ready(self) -> None:
        self._read()

    def run(self, size: int, steps: int, n: int, first: int = 0, warm: bool = False, batch: int = 1) -> float:
        """Seconds for ``n`` serial calls of ``batch`` images."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"size": size, "steps": steps, "n": n, "first": first, "warm": warm, "batch": batch}) + "\n"
        )
        self.proc.stdin.flush()
        return float(self._read()["seconds"])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def busy_fraction(infos: list[dict[str, Any]]) -> float:
    """Busy time of the GPU section over the time it had work: inference time over inference time
    plus the gaps during which a job was ready (its ``gpu_wait_start``) and the section was idle.

    A gap during which no job was waiting is the load generator's (a client still connecting, the
    pause between rounds), not the app's, and is not counted. Jobs of one batch share one span.
    A record without ``gpu_wait_start`` counts as ready all along (its whole gap counts).
    """
    ready: dict[tuple[float, float], float] = {}
    for i in infos:
        t = i["timings"]
        span = (t["infer_start"], t["infer_end"])
        ready[span] = min(ready.get(span, math.inf), t.get("gpu_wait_start", -math.inf))
    spans = sorted(ready)
    busy = sum(b - a for a, b in spans)
    idle = sum(max(0.0, nxt[0] - max(prev[1], ready[nxt])) for prev, nxt in zip(spans, spans[1:]))
    return busy / (busy + idle)


def mean_inference(infos: list[dict[str, Any]]) -> float:
    return statistics.mean(i["timings"]["infer_end"] - i["timings"]["infer_start"] for i in infos)


def overhead(server: Server, raw: Raw, plan: dict[int, tuple[int, int]], steps: int, clients: int) -> dict[int, Any]:
    """App throughput (K clients) over the raw pipeline's, in alternating rounds of ``per_round`` images.

    ``plan`` maps each size to (rounds, per_round): fewer images where one costs more.

    The machine's speed drifts by tens of percent within a minute, so raw and app rounds alternate,
    in ABBA order (raw, app; app, raw; ...: a steady drift favours neither), each round followed by
    one idle app request, and each figure is a ratio of sums over the same rounds.
    ``inference_app_over_raw`` (the app's mean inference under load over the raw pipeline's time
    per image) tells a slower model thread (or a slower stretch of the machine) from serving work.
    """
    rows = {}
    for size, (rounds, per_round) in plan.items():
        raw.run(size, steps, 1, warm=True)
        predict_many(server.url, 1, 1, size=size, steps=2)  # warm this size (allocations, not steps)
        raw_s = app_s = 0.0
        loaded: list[dict[str, Any]] = []
        idle: list[dict[str, Any]] = []
        errors: list[str] = []
        for r in range(rounds):
            if r % 2 == 0:
                raw_s += raw.run(size, steps, per_round, first=r * per_round)
            t0 = time.monotonic()
            infos, errs = predict_many(server.url, per_round, clients, size=size, steps=steps)
            app_s += time.monotonic() - t0
            if r % 2 == 1:
                raw_s += raw.run(size, steps, per_round, first=r * per_round)
            loaded += infos
            errors += errs
            idle += predict_many(server.url, 1, 1, size=size, steps=steps)[0]
        raw_ips = rounds * per_round / raw_s
        app_ips = len(loaded) / app_s
        rows[size] = {
            "raw_images_per_second": raw_ips,
            "app_images_per_second": app_ips,
            "throughput_ratio": app_ips / raw_ips,
            "gpu_busy_fraction": busy_fraction(loaded),
            "inference_load_over_idle": mean_inference(loaded) / mean_inference(idle),
            "inference_app_over_raw": mean_inference(loaded) / (raw_s / (rounds * per_round)),
            "errors": len(errors),
        }
    return rows


def responsiveness(
    server: Server, size: int, steps: int, clients: int, seconds: float, fn_index: int
) -> dict[str, Any]:
    idle_health = sample_health(server.url, seconds / 2)
    http = httpx.Client(timeout=60)
    light_request(server.url, fn_index, http)  # open the connection
    idle_light = [light_request(server.url, fn_index, http) for _ in range(20)]
    stop = threading.Event()
    load = threading.Thread(target=lambda: predict_many(server.url, 10**6, clients, size=size, steps=steps, stop=stop))
    load.start()
    time.sleep(1.0)
    busy_health = sample_health(server.url, seconds)
    busy_light = [light_request(server.url, fn_index, http) for _ in range(20)]
    stop.set()
    load.join()
    http.close()
    return {
        "health_idle_ms": pct(idle_health),
        "health_load_ms": pct(busy_health),
        "light_idle_ms": pct(idle_light),
        "light_load_ms": pct(busy_light),
    }


def memory(server: Server, size: int, steps: int) -> dict[str, Any]:
    """Peak RSS (and, on a GPU, peak device memory from the info records) with 1 and 16 requests."""
    (infos_1, _), one = server.peak_rss(lambda: predict_many(server.url, 1, 1, size=size, steps=steps))
    (infos_16, _), sixteen = server.peak_rss(lambda: predict_many(server.url, 16, 16, size=size, steps=steps))
    row = {"rss_1_mb": one / 2**20, "rss_16_mb": sixteen / 2**20, "rss_16_over_1": sixteen / one}
    device = [max((i.get("peak_memory_bytes") or 0) for i in infos) for infos in (infos_1, infos_16)]
    if device[0]:
        row.update(
            device_peak_1_mb=device[0] / 2**20,
            device_peak_16_mb=device[1] / 2**20,
            device_peak_16_over_1=device[1] / device[0],
        )
    return row


def design_chunk(server: Server, size: int, steps: int, n: int, row: dict[str, Any], clients: int = 16) -> None:
    """``n`` requests from ``clients`` concurrent clients, with /health and light-event probes alongside; adds to ``row``."""
    fn_index = fn_index_of(server.url)
    stop = threading.Event()
    health: list[float] = []
    light: list[float] = []

    def probe() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                health.extend(sample_health(server.url, 0.5))
                light.append(light_request(server.url, fn_index, http))

    prober = threading.Thread(target=probe)
    t0 = time.monotonic()
    prober.start()
    (infos, errors), peak = server.peak_rss(lambda: predict_many(server.url, n, clients, size=size, steps=steps))
    row["seconds"] = row.get("seconds", 0.0) + time.monotonic() - t0
    stop.set()
    prober.join()
    row["images"] = row.get("images", 0) + len(infos)
    row["errors"] = row.get("errors", 0) + len(errors)
    row.setdefault("error_sample", []).extend(errors[:1])
    row.setdefault("_health", []).extend(health)
    row.setdefault("_light", []).extend(light)
    row["peak_rss_mb"] = max(row.get("peak_rss_mb", 0.0), peak / 2**20)


def naive_designs(
    servers: dict[str, Server], size: int, steps: int, rounds: int, per_round: int, clients: int = 16
) -> dict[str, Any]:
    """This design and the ones DESIGN.md warns against, on the same load, in alternating rounds."""
    rows: dict[str, dict[str, Any]] = {d: {} for d in servers}
    for server in servers.values():
        predict_many(server.url, 2, 1, size=size, steps=steps)  # warm
    for _ in range(rounds):
        for design, server in servers.items():
            design_chunk(server, size, steps, per_round, rows[design], clients)
    for row in rows.values():
        row["images_per_second"] = row["images"] / row["seconds"]
        row["health_p99_ms"] = pct(row.pop("_health"))["p99"]
        row["light_p99_ms"] = pct(row.pop("_light"))["p99"]
        row["error_sample"] = row["error_sample"][:1]
    base = rows["gated"]
    for row in rows.values():
        row["throughput_vs_gated"] = row["images_per_second"] / base["images_per_second"]
        row["rss_vs_gated"] = row["peak_rss_mb"] / base["peak_rss_mb"]
    return rows


def batching(
    b1: Server, b4: Server, raw: Raw, plan: dict[int, tuple[int, ...]], steps: int, clients: int, batch: int
) -> dict[str, Any]:
    """Dynamic batching: the app with ``--max-batch-size batch`` against 1, and the raw pipeline's own gain.

    ``plan`` maps each size to (rounds, n) or (rounds, n, n1). Per size and round: the raw pipeline
    runs ``n1`` (default ``n``) images one at a time and ``n`` in batches of ``batch``; the batched
    app server serves ``n`` requests and the unbatched one ``n1``, from ``clients`` concurrent
    clients. Gains are ratios of images per second over the same rounds (``n1 < n`` only where one
    image costs seconds: the unbatched side has no batch to fill).

    The raw pipeline runs batch after batch; a closed loop of clients has a start (the first
    request meets a free gate and runs alone) and an end (fewer requests left than clients). Where a
    round has at least ``3 * clients`` requests, ``app_gain`` is the steady-state gain, from the
    rates in the saturated window of each run (``steady_rate``: the same rule for both servers);
    ``app_gain_whole_run`` is always the whole-run one.
    """
    rows: dict[Any, Any] = {}
    sizes = list(plan)
    for size, (size_rounds, n, *rest) in plan.items():
        n1 = rest[0] if rest else n
        raw.run(size, steps, 1, warm=True, batch=batch)
        for server in (b1, b4):
            predict_many(server.url, 2, 2, size=size, steps=2)  # warm: allocations, not steps
        raw1 = raw_b = app1 = app_b = 0.0
        steady: dict[Server, list[float | None]] = {b1: [], b4: []}
        sizes_seen: list[int] = []
        errors = 0
        for r in range(size_rounds):
            raw1 += raw.run(size, steps, n1, first=r * n) / n1
            raw_b += raw.run(size, steps, n // batch, first=r * n, batch=batch) / n
            for server in (b4, b1):
                count = n if server is b4 else n1
                finished: list[float] = []
                t0 = time.monotonic()
                infos, errs = predict_many(server.url, count, clients, size=size, steps=steps, finished=finished)
                elapsed = (time.monotonic() - t0) / count
                errors += len(errs)
                steady[server].append(steady_rate(finished, clients) if count >= 3 * clients else None)
                if server is b4:
                    app_b += elapsed
                    sizes_seen += [i["batch_size"] for i in infos]
                else:
                    app1 += elapsed
        raw_gain, whole_gain = raw1 / raw_b, app1 / app_b
        rates = steady[b4] + steady[b1]
        steady_gain = None if None in rates else sum(steady[b4]) / sum(steady[b1])  # type: ignore[arg-type]
        app_gain = steady_gain if steady_gain is not None else whole_gain
        rows[size] = {
            "raw_gain": raw_gain,
            "app_gain": app_gain,
            "app_gain_over_raw_gain": app_gain / raw_gain,
            "app_gain_measured": "steady state" if steady_gain is not None else "whole run",
            "app_gain_whole_run": whole_gain,
            "mean_batch_size": statistics.mean(sizes_seen),
            "errors": errors,
            "app_batched_images_per_second": size_rounds / app_b,
            "app_unbatched_images_per_second": size_rounds / app1,
            "rounds": size_rounds,
            "requests": n,
            "requests_unbatched": n1,
        }
    # Low load: one client, one request at a time; batching must cost nothing there.
    lat: dict[str, list[float]] = {"b1": [], "b4": []}
    for _ in range(2):
        for name, server in (("b4", b4), ("b1", b1)):
            infos, _ = predict_many(server.url, 2, 1, size=sizes[0], steps=steps)
            lat[name] += [i["durations_ms"]["total"] for i in infos]
    rows["low_load_latency_batched_over_unbatched"] = statistics.median(lat["b4"]) / statistics.median(lat["b1"])
    rows["max_batch_size"] = batch
    rows["clients"] = clients
    _, peak_b4 = b4.peak_rss(lambda: predict_many(b4.url, 16, 16, size=sizes[0], steps=steps))
    _, one_b4 = b4.peak_rss(lambda: predict_many(b4.url, 1, 1, size=sizes[0], steps=steps))
    rows["rss_16_over_1_batched"] = peak_b4 / one_b4
    return rows


def cancel_cost(server: Server, size: int) -> dict[str, Any]:
    """Steps a running job runs after its cancel reaches the server, and how soon the next job starts.

    The server counts the steps itself (``steps_after_stop``: the model thread's step count when the
    stop event was set against the step it stopped at), so the client's round trip is not counted.
    """
    from gradio_client import Client

    def metric(name: str) -> float:
        text = httpx.get(server.url + "metrics", timeout=10).text
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))

    a, b = Client(server.url, verbose=False), Client(server.url, verbose=False)
    stops = []
    starts = []
    for k in range(3):
        start, count0, sum0 = (
            metric("denoise_steps_total"),
            metric("steps_after_stop_count"),
            metric("steps_after_stop_sum"),
        )
        job_a = a.submit(
            prompt="long",
            randomize_seed=False,
            seed=k,
            width=size,
            height=size,
            num_inference_steps=100,
            api_name="/generate",
        )
        while metric("denoise_steps_total") - start < 5:
            time.sleep(0.005)
        job_b = b.submit(
            prompt="next",
            randomize_seed=False,
            seed=k,
            width=size,
            height=size,
            num_inference_steps=5,
            api_name="/generate",
        )
        while httpx.get(server.url + "health").json()["gpu_queue_depth"] < 1:
            time.sleep(0.005)
        cancelled_at = time.time()
        threading.Thread(target=job_a.cancel).start()
        _, info_b = job_b.result(timeout=120)
        deadline = time.monotonic() + 10
        while metric("steps_after_stop_count") == count0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stops.append((metric("steps_after_stop_sum") - sum0) / max(1.0, metric("steps_after_stop_count") - count0))
        starts.append((info_b["timings"]["infer_start"] - cancelled_at) * 1000)
    return {
        "steps_after_cancel": max(stops),
        "steps_after_cancel_mean": statistics.mean(stops),
        "next_job_start_ms": statistics.median(starts),
    }


def cold_start(server: Server, size: int, steps: int) -> dict[str, Any]:
    """Process start to first image, on the freshly started main server."""
    predict_many(server.url, 1, 1, size=size, steps=steps)
    return {
        "process_start_to_ready_s": server.ready_after,
        "process_start_to_first_image_s": time.monotonic() - server.started,
    }


def fn_index_of(url: str) -> int:
    config = httpx.get(url + "config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")


def versions() -> dict[str, str]:
    """From the installed packages' metadata: importing them here would cost the load generator
    ~15 s of CPU (torch, diffusers, gradio, ray) for four strings."""
    found = {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
    }
    for name in ("torch", "diffusers", "gradio", "ray"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "ray":  # optional: only the Ray backend needs it
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sizes (under 2 minutes)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="torch threads")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: a full-size SD 1.5 architecture with random weights (bench.sd15)",
    )
    parser.add_argument("--max-batch-size", type=int, default=4, help="the batching section's batch size")
    parser.add_argument("--model", default="", help="model path (default: the embedded model; SD 1.5 on cuda)")
    parser.add_argument(
        "--backend",
        default="local",
        choices=["local", "ray"],
        help="ray: the Ray Serve backend's scaling benchmark (bench.scale) instead",
    )
    args = parser.parse_args(argv)
    if args.backend == "ray":
        return scale_main(args)
    quick, gpu = args.quick, args.device == "cuda"
    model = args.model
    if gpu and not model:
        from bench.sd15 import build

        model = str(build(Path(tempfile.gettempdir()) / "sd15-random"))
    if gpu:
        sizes, small, steps = ([256, 512] if quick else [256, 512, 768]), 256, 20
    else:
        # Quick checks that every figure comes out, under 2 minutes: six processes load at once
        # (~14 s of imports each on 2 cores), so the model work gets 8 steps instead of 20.
        sizes, small, steps = ([64] if quick else [64, 128, 256]), 64, (8 if quick else 20)
    rounds = (2 if gpu else 1) if quick else 3  # quick on the CPU: every figure once, for coverage
    # (rounds, images per round) per size. On the CPU an image costs ~1 : 4.5 : 22 at 64 : 128 : 256
    # px (the default model's VAE downsamples by 4), so larger sizes get fewer images, to keep the
    # full run under 10 minutes; their ratios are noisier for it.
    if quick:
        overhead_plan = {size: (rounds, 3) for size in sizes}
        batching_plan: dict[int, tuple[int, ...]] = {small: (1, 8)}
    elif gpu:
        overhead_plan = {size: (rounds, 5) for size in sizes}
        batching_plan = {size: (2, max(8, 24 * 64 // size)) for size in sizes}
    else:
        overhead_plan = {64: (3, 4), 128: (2, 4), 256: (2, 2)}
        # 64 px: one round of 3 requests per client, so that the closed loop has a steady state
        # to measure (see batching); it costs what two rounds of 12 did.
        # 256 px: 2 images on the unbatched side (about 9 s each here), 4 (one batch) on the other.
        batching_plan = {64: (1, 24), 128: (1, 4), 256: (1, 4, 2)}
    results_plan: dict[str, Any] = {"overhead": overhead_plan, "batching": batching_plan}
    flags = ["--torch-threads", str(args.threads), "--concurrency", "16", "--device", args.device]
    # The overhead and design sections compare like with like: one request per inference, as the
    # raw pipeline and the naive designs run. Batching has its own section, on its own server.
    unbatched = [*flags, "--max-batch-size", "1"]
    if model:
        flags += ["--model", model]
    results: dict[str, Any] = {
        "mode": ("quick" if quick else "full") + (" gpu" if gpu else ""),
        "versions": versions(),
        "steps": steps,
        "plan": {k: {str(s): list(v) for s, v in p.items()} for k, p in results_plan.items()},
    }
    started = time.monotonic()
    stages: dict[str, float] = {}

    def timed(name: str, fn: Any, *a: Any, **k: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            stages[name] = round(time.monotonic() - t0, 1)

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        # Full: the app starts alone (cold start), then the raw pipeline and the naive designs load
        # together. Quick: all of them at once (loading is CPU-bound, ~14 s of imports per process on
        # 2 cores), so its cold start is a contended one and says so.
        server = Server("gated", tmp, *unbatched, start=not quick)
        servers = {"gated": server}
        extra: list[Server] = []
        raw = None

        def load_the_rest() -> None:
            nonlocal raw, extra
            raw = Raw(args.threads, args.device, model)
            for design in ("whole_lock", "no_gate", "on_loop"):
                servers[design] = Server(design, tmp, *unbatched, start=False)
            extra = [
                *[servers[d] for d in ("whole_lock", "no_gate", "on_loop")],
                Server("gated", tmp, *flags, "--max-batch-size", str(args.max_batch_size), start=False),
            ]

        try:
            if quick:
                load_the_rest()
                server.wait_ready()
            results["cold_start"] = timed("cold_start", cold_start, server, small, steps)
            results["cold_start"]["contended"] = quick
            if not quick:
                load_the_rest()
            assert raw is not None
            batched = extra[-1]
            raw.wait_ready()
            for s in extra:
                s.wait_ready()
            fn_index = fn_index_of(server.url)
            results["overhead"] = timed("overhead", overhead, server, raw, overhead_plan, steps, clients=4)
            results["responsiveness"] = timed(
                "responsiveness", responsiveness, server, small, steps, 4, 1.0 if quick else 5.0, fn_index
            )
            results["memory"] = timed("memory", memory, server, small, steps)
            results["cancel"] = timed("cancel", cancel_cost, server, small)
            # Quick: 4 requests from 4 clients per design (creating a gradio_client Client costs the
            # machine ~0.3 s of CPU; 16 of them for 4 requests was most of the section).
            results["designs"] = timed(
                "designs", naive_designs, servers, small, steps, 1, 4 if quick else 16, 4 if quick else 16
            )
            results["designs_clients"] = 4 if quick else 16
            results["batching"] = timed(
                "batching", batching, server, batched, raw, batching_plan, steps, 8, args.max_batch_size
            )
        finally:
            if raw is not None:
                raw.close()
            for s in [*servers.values(), *extra]:
                s.close()
    results["designs_size"] = small
    results["seconds"] = time.monotonic() - started
    results["stage_seconds"] = stages
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(render(results))
    return 0


def scale_main(args: argparse.Namespace) -> int:
    from bench import scale

    results = scale.run(args.quick, args.device, args.model)
    results["mode"] = "quick" if args.quick else "full"
    results["versions"] = versions()
    path = (
        args.json
        if args.json != ROOT / "bench" / "results" / "latest.json"
        else ROOT / "bench" / "results" / "ray.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(scale.render(results, results["versions"]))
    return 0


def render(r: dict[str, Any]) -> str:
    v = r["versions"]
    lines = [
        f"Benchmark ({r['mode']}, {r['seconds']:.0f} s): {v['cores']} cores {v['cpu']}, torch {v['torch']}, "
        f"diffusers {v['diffusers']}, gradio {v['gradio']}, {r['steps']} steps",
        "",
        "| size | app / raw throughput | GPU section busy | inference under load / idle | "
        "app inference / raw | raw img/s | app img/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, row in r["overhead"].items():
        vs_raw = f"{row['inference_app_over_raw']:.3f}" if "inference_app_over_raw" in row else "-"
        lines.append(
            f"| {size} px | {row['throughput_ratio']:.3f} | {row['gpu_busy_fraction']:.3f} | "
            f"{row['inference_load_over_idle']:.3f} | {vs_raw} | {row['raw_images_per_second']:.2f} | "
            f"{row['app_images_per_second']:.2f} |"
        )
    resp = r["responsiveness"]
    lines += ["", "| latency (ms) | idle p50 / p95 / p99 | under load p50 / p95 / p99 |", "|---|---|---|"]
    for name, key in (("/health", "health"), ("light queued event (rejected by validation)", "light")):
        idle, load = resp[f"{key}_idle_ms"], resp[f"{key}_load_ms"]
        lines.append(
            f"| {name} | {idle['p50']:.1f} / {idle['p95']:.1f} / {idle['p99']:.1f} | "
            f"{load['p50']:.1f} / {load['p95']:.1f} / {load['p99']:.1f} |"
        )
    m, c, cs = r["memory"], r["cancel"], r["cold_start"]
    if "device_peak_16_over_1" in m:
        lines += [
            "",
            f"Peak GPU memory: 1 request {m['device_peak_1_mb']:.0f} MiB, 16 concurrent "
            f"{m['device_peak_16_mb']:.0f} MiB, ratio **{m['device_peak_16_over_1']:.3f}**.",
        ]
    lines += [
        "",
        f"Peak RSS: 1 request {m['rss_1_mb']:.0f} MiB, 16 concurrent {m['rss_16_mb']:.0f} MiB, "
        f"ratio **{m['rss_16_over_1']:.3f}**. Cancel: at most **{c['steps_after_cancel']:.0f}** step after the cancel reached the server "
        f"(mean {c['steps_after_cancel_mean']:.2f}), next job started {c['next_job_start_ms']:.0f} ms after the client's cancel. Cold start: ready in "
        f"{cs['process_start_to_ready_s']:.1f} s, first image at {cs['process_start_to_first_image_s']:.1f} s"
        f"{' (quick: loaded alongside the other servers)' if cs.get('contended') else ''}.",
        "",
        f"| design ({r.get('designs_clients', 16)} concurrent, {r['designs_size']} px) | throughput vs gated | /health p99 ms | light p99 ms | peak RSS vs gated | errors |",
        "|---|---|---|---|---|---|",
    ]
    for design, row in r["designs"].items():
        lines.append(
            f"| {design} | {row['throughput_vs_gated']:.3f} | {row['health_p99_ms']:.1f} | "
            f"{row['light_p99_ms']:.1f} | {row['rss_vs_gated']:.3f} | {row['errors']} |"
        )
    b = r["batching"]
    lines += [
        "",
        f"| dynamic batching ({b['clients']} clients, max batch {b['max_batch_size']}) | app gain "
        "(batched / unbatched) | raw pipeline gain (batch / 1) | app gain / raw gain | mean batch | errors |",
        "|---|---|---|---|---|---|",
    ]
    for size, row in b.items():
        if isinstance(row, dict):
            gain = f"{row['app_gain']:.2f}"
            if row.get("app_gain_measured") == "steady state":
                gain += f" (steady state; whole run {row['app_gain_whole_run']:.2f})"
            lines.append(
                f"| {size} px | {gain} | {row['raw_gain']:.2f} | "
                f"{row['app_gain_over_raw_gain']:.2f} | {row['mean_batch_size']:.2f} | {row['errors']} |"
            )
    lines += [
        "",
        f"Batching at low load (one client): latency batched / unbatched "
        f"**{b['low_load_latency_batched_over_unbatched']:.3f}**; peak RSS with 16 concurrent / 1 on the "
        f"batched server **{b['rss_16_over_1_batched']:.3f}**.",
    ]
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

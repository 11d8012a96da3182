"""The benchmark's sections: overhead against the raw pipeline, responsiveness, memory, the naive
designs, batching, the cost of a cancel and the cold start (``bench.__main__`` runs them)."""

from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Any

import httpx

from bench.harness import Raw, Server, fn_index_of
from bench.probe import light_request, pct, predict_many, sample_health, steady_rate


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
        if not loaded:  # say why, rather than divide by an empty record below
            raise RuntimeError(f"no app request succeeded at {size} px ({len(errors)} failed): {errors[:3]}")
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

"""The benchmark's table (``bench.__main__`` writes it; ``tests/unit/test_bench.py`` checks it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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


def publish(result: dict[str, Any], path: Path | None) -> None:
    """A run's result as JSON: printed, and written to ``path`` (``--json``) where given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path is not None:
        path.write_text(text + "\n")

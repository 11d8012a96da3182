"""The fast-device benchmark's table (``bench.fast`` runs it; this renders its JSON)."""

from __future__ import annotations

from typing import Any


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
        "| model inference under load / idle | peak RSS of the process tree MiB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
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

"""The open-loop benchmark's tables (``bench.openloop`` runs it; this renders its JSON)."""

from __future__ import annotations

import math
from typing import Any, Sequence

DESIGNS = ("none", "job", "step")  # bench.openloop.DESIGNS' names, in the tables' order


def _f(value: Any, fmt: str = ".0f") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _joined(steps: Sequence[int | None]) -> str:
    """The late requests' ``joined_at_step`` over the rounds ("-" where the records carry none)."""
    return ", ".join(str(j) for j in steps if j is not None) or "-"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"Open-loop batching benchmark ({'quick' if result['quick'] else 'full'}, {result['cores']} cores, "
        f"{result['seconds']:.0f} s)"
    ]
    for s in result["sections"]:
        names = [d for d in DESIGNS if d in s["capacity"]]
        what = "embedded default model" if s["spec"] is None else f"`{s['spec']}`"
        cap = s["capacity"]
        lines += [
            "",
            f"### {s['model']}: {what}, {s['size']} px, {s['steps']} steps",
            "",
            f"100 % load = the `{s.get('load_base', 'none')}` design's saturated rate, "
            f"{s['capacity_clients']} callers in a closed "
            f"loop: **{s['rate_100_images_per_second']:.2f} img/s**. Latency: scheduled submit to images "
            f"received; seeded Poisson arrivals (the same for every design), "
            f"{s['open_loop'][next(iter(s['open_loop']))]['requests']} requests per point, one image each; "
            "img/s: achieved (mean batch).",
            "",
        ]
        points = list(s["open_loop"])
        head = ["design", "saturated img/s (mean batch)"]
        for p in points:
            head += [f"{p} ({s['open_loop'][p]['rate_per_second']:.2f}/s): p50 / p95 / p99 ms", f"{p}: img/s (batch)"]
        lines += ["| " + " | ".join(head) + " | errors |", "|" + "---|" * (len(head) + 1)]
        for d in names:
            errors = cap[d]["errors"]
            row = [d, f"{cap[d]['images_per_second']:.2f} ({_f(cap[d]['mean_batch_size'], '.2f')})"]
            for p in points:
                o = s["open_loop"][p][d]
                lat = o["latency_ms"]
                row += [
                    f"{_f(lat.get('p50'))} / {_f(lat.get('p95'))} / {_f(lat.get('p99'))}",
                    f"{o['achieved_images_per_second']:.2f} ({_f(o['mean_batch_size'], '.2f')})",
                ]
                errors += o["errors"]
            lines.append("| " + " | ".join(row) + f" | {errors} |")
        b, lt, m = s["burst"], s["late"], s["memory"]
        raw = b.get("raw")
        raw_text = (
            f" The raw pipeline on the same {b['requests']}: {raw['one_by_one_s']:.2f} s one by one, "
            f"{raw['batched_s']:.2f} s in batches of {raw['batch']}, a gain of {raw['gain']:.2f}x."
            if raw
            else ""
        )
        lines += [
            "",
            f"Burst: {b['requests']} at once; one by one on `none`: {b['sequential_on_none_s']:.2f} s.{raw_text} "
            f"Late arrival: sent {lt['sent_after_steps']} steps into a {lt['long_steps']}-step job; its wait is "
            f"its record's `gpu_wait`. Memory: peak RSS of the process tree, {m['concurrent']['full']} "
            f"concurrent requests against {m['concurrent']['batch']} (one full batch).",
            "",
            "| design | burst makespan s | burst / one by one | burst gain / raw gain | late: wait ms | "
            "late: one step ms | "
            "late: wait / step | late: arrived at step | late: joined at step | peak RSS 4 MiB | "
            "peak RSS 16 MiB | 16 / 4 | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in names:
            errors = b[d]["errors"] + lt[d]["errors"] + m[d]["errors"]
            lines.append(
                f"| {d} | {b[d]['makespan_s']:.2f} | {b[d]['over_sequential']:.2f} | "
                f"{_f(b[d].get('gain_over_raw_gain'), '.2f')} | {_f(lt[d]['wait_ms'])} | "
                f"{_f(lt[d]['step_ms'], '.1f')} | {_f(lt[d]['wait_over_step'], '.2f')} | "
                f"{_f(lt[d]['arrived_at_step'], '.1f')} | {_joined(lt[d]['joined_at_step'])} | "
                f"{m[d]['rss_batch_mb']:.0f} | "
                f"{m[d]['rss_full_mb']:.0f} | {m[d]['full_over_batch']:.3f} | {errors} |"
            )
    return "\n".join(lines)


def errors_of(result: dict[str, Any]) -> int:
    """Every failed request in the run (the exit status)."""
    total = 0
    for s in result["sections"]:
        designs = [d for d in DESIGNS if d in s["capacity"]]
        total += sum(s["capacity"][d]["errors"] for d in designs)
        total += sum(p[d]["errors"] for p in s["open_loop"].values() for d in designs)
        total += s["burst"]["sequential_errors"]
        total += sum(s[k][d]["errors"] for k in ("burst", "late", "memory") for d in designs)
    return total

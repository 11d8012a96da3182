"""Image-to-image requests arriving into a running text loop (issue 38): what sharing buys.

    python -m bench.image_join [--quick] [--model PATH] [--json FILE]

Two servers of the app on the same model, alternated round by round (ABBA):

- ``step`` (the default): an image-to-image request enters the running step-level loop at its own
  first timestep (``int(steps × strength)`` from the end), beside the text members;
- ``job`` (``--step-joining off``): no sharing between modes: an image-to-image request waits for
  the running text call to end (image requests still share whole calls among themselves).

Two measurements, each on both servers in the same rounds:

1. **Late arrival**: a long text job (``LONG_STEPS`` steps); once the server has counted
   ``SENT_AFTER`` of its steps, an image-to-image request (strength ``STRENGTH``). Its wait before
   its first step, against one step of the running job (``bench.stats.late_figures``).
2. **Mixed throughput**: ``MIXED`` requests at once, half text and half image-to-image at two
   strengths: images a second over the makespan, and each mode's median latency.

The embedded default model is an SD-family model whose loop takes image-to-image members
(``ModelProfile.loop_modes``); on a model whose loops take text only both designs run alike.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench import loadgen
from bench.harness import Server, versions
from bench.stats import late_figures, orders

DESIGNS = {"step": ("--step-joining", "on"), "job": ("--step-joining", "off")}
COMMON = ("--concurrency", "32", "--queue-size", "256", "--max-batch-size", "4")
SIZE = 64
LONG_STEPS = 20
SENT_AFTER = 3
STRENGTH = 0.5
MIXED = 8
TIMEOUT = 300.0


def picture_png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


async def upload(http: httpx.AsyncClient, url: str, seed: int) -> dict[str, Any]:
    """One picture through the app's upload route; the value an image input takes (Gradio's FileData)."""
    answer = await http.post(
        url + "gradio_api/upload", files={"files": ("picture.png", picture_png(seed), "image/png")}
    )
    answer.raise_for_status()
    return {"path": answer.json()[0], "meta": {"_type": "gradio.FileData"}}


def data(k: int, steps: int, picture: dict[str, Any] | None = None, strength: float = STRENGTH) -> list[Any]:
    """``/generate``'s inputs: a text request, or image-to-image from ``picture``."""
    inputs = loadgen.generate_data(k, SIZE, steps)
    if picture is not None:
        from pipeline.fields import NAMES

        inputs[NAMES.index("mode")] = "image"
        inputs[NAMES.index("image")] = picture
        inputs[NAMES.index("strength")] = strength
    return inputs


async def _steps_counted(http: httpx.AsyncClient, url: str) -> float:
    for line in (await http.get(url + "metrics")).text.splitlines():
        if line.startswith("denoise_steps_total "):
            return float(line.split()[1])
    raise RuntimeError("the server counts no denoise_steps_total")


async def _request(http: httpx.AsyncClient, url: str, inputs: list[Any]) -> loadgen.Outcome:
    fn_index, trigger_id = await loadgen._endpoint(http, url, "generate")
    return await loadgen.async_request(http, url, fn_index, trigger_id, uuid.uuid4().hex[:11], inputs)


async def late_arrival(url: str, k: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        picture = await upload(http, url, k)
        base = await _steps_counted(http, url)
        long_task = asyncio.create_task(_request(http, url, data(k, LONG_STEPS)))
        while not long_task.done() and await _steps_counted(http, url) - base < SENT_AFTER:
            await asyncio.sleep(0.005)
        sent_while_running = not long_task.done()
        late = await _request(http, url, data(k + 1, LONG_STEPS, picture))
        long = await long_task
    if not (long.ok and late.ok and long.info and late.info):
        return {"errors": int(not long.ok) + int(not late.ok), "error_messages": [long.error, late.error]}
    return {**late_figures(long.info, late.info, LONG_STEPS), "sent_while_running": sent_while_running,
            "late_latency_ms": late.latency_ms, "late_steps_done": late.info.get("steps_done"), "errors": 0}  # fmt: skip


async def mixed(url: str, k: int) -> dict[str, Any]:
    """``MIXED`` requests at once: text and image-to-image (strengths 0.5 and 0.75) alternating."""
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_connections=4 * MIXED)) as http:
        pictures = [await upload(http, url, k + i) for i in range(MIXED // 2)]
        inputs = [data(k + i, LONG_STEPS, pictures[i // 2] if i % 2 else None, (0.5, 0.75)[i // 2 % 2])
                  for i in range(MIXED)]  # fmt: skip
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(_request(http, url, x) for x in inputs))
        seconds = time.perf_counter() - t0
    good = [o for o in outcomes if o.ok and o.info]
    by_mode = {mode: [o.latency_ms for o in good if o.info and o.info.get("mode", "text") == mode]
               for mode in ("text", "image")}  # fmt: skip
    return {
        "images_per_second": len(good) / seconds,
        "makespan_s": seconds,
        "median_ms": {mode: statistics.median(v) if v else None for mode, v in by_mode.items()},
        "step_batched": sum(1 for o in good if o.info and o.info.get("batching") == "step"),
        "errors": len(outcomes) - len(good),
        "error_messages": [o.error for o in outcomes if not o.ok][:3],
    }


def run(model: str | None, rounds: int, tmp: Path) -> dict[str, Any]:
    flags = ("--model", model) if model else ()
    servers = {d: Server("gated", tmp / d, *flags, *COMMON, *DESIGNS[d], start=False) for d in DESIGNS}
    try:
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():  # warm: each path once (text, image-to-image, the shared loop)
            asyncio.run(late_arrival(server.url, 900))
        late: dict[str, list[dict[str, Any]]] = {d: [] for d in DESIGNS}
        mix: dict[str, list[dict[str, Any]]] = {d: [] for d in DESIGNS}
        for r, order in enumerate(orders(list(DESIGNS), rounds)):
            for d in order:
                late[d].append(asyncio.run(late_arrival(servers[d].url, 1000 + 100 * r)))
                mix[d].append(asyncio.run(mixed(servers[d].url, 2000 + 100 * r)))
    finally:
        for server in servers.values():
            server.close()
    result: dict[str, Any] = {"versions": versions(), "model": model or "embedded default", "size": SIZE,
                              "long_steps": LONG_STEPS, "sent_after_steps": SENT_AFTER, "strength": STRENGTH,
                              "mixed": MIXED, "rounds": rounds, "designs": {}}  # fmt: skip
    for d in DESIGNS:
        good = [g for g in late[d] if not g["errors"]]

        def med(rows: list[dict[str, Any]], key: str) -> float | None:
            values = [row[key] for row in rows if row.get(key) is not None]
            return statistics.median(values) if values else None

        result["designs"][d] = {
            "flags": [*COMMON, *DESIGNS[d]],
            "late_wait_ms": med(good, "wait_ms"),
            "late_step_ms": med(good, "step_ms"),
            "late_wait_over_step": med(good, "wait_over_step"),
            "late_latency_ms": med(good, "late_latency_ms"),
            "late_batching": [g.get("batching") for g in good],
            "late_steps_done": [g.get("late_steps_done") for g in good],
            "mixed_images_per_second": med(mix[d], "images_per_second"),
            "mixed_text_median_ms": statistics.median(m["median_ms"]["text"] for m in mix[d]),
            "mixed_image_median_ms": statistics.median(m["median_ms"]["image"] for m in mix[d]),
            "mixed_step_batched": [m["step_batched"] for m in mix[d]],
            "errors": sum(g["errors"] for g in late[d]) + sum(m["errors"] for m in mix[d]),
            "error_messages": [e for g in late[d] + mix[d] for e in g.get("error_messages", []) if e][:3],
        }
    s, j = result["designs"]["step"], result["designs"]["job"]
    result["step_over_job"] = {
        "late_wait": s["late_wait_ms"] / j["late_wait_ms"] if s["late_wait_ms"] and j["late_wait_ms"] else None,
        "mixed_throughput": s["mixed_images_per_second"] / j["mixed_images_per_second"],
    }
    return result


def render(result: dict[str, Any]) -> str:
    def f(x: Any, fmt: str = ".0f") -> str:
        return format(x, fmt) if isinstance(x, (int, float)) else "-"

    lines = [
        f"Image-to-image into a running text loop: {result['model']}, {result['size']} px, {result['long_steps']} "
        f"steps, strength {result['strength']}, {result['rounds']} rounds",
        "",
        "| design | late: wait ms | late: one step ms | late: wait / step | late: total ms | "
        f"mixed ×{result['mixed']}: img/s | text median ms | image median ms | step-batched | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d, row in result["designs"].items():
        lines.append(
            f"| {d} | {f(row['late_wait_ms'])} | {f(row['late_step_ms'])} | {f(row['late_wait_over_step'], '.2f')} | "
            f"{f(row['late_latency_ms'])} | {f(row['mixed_images_per_second'], '.2f')} | "
            f"{f(row['mixed_text_median_ms'])} | {f(row['mixed_image_median_ms'])} | "
            f"{row['mixed_step_batched']} | {row['errors']} |"
        )
    ratio = result["step_over_job"]
    lines += ["", f"step / job: late wait {f(ratio['late_wait'], '.2f')}x, "
              f"mixed throughput {f(ratio['mixed_throughput'], '.2f')}x"]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 4")
    parser.add_argument("--model", default=None, help="a model path (default: the embedded model)")
    parser.add_argument("--json", default=None, help="write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.model, 2 if args.quick else 4, Path(tmp))
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if any(row["errors"] for row in result["designs"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Page users against API users (issue 28): what a person on the page costs the server.

    python -m bench.page [--quick] [--sections sim-512,sim-1024,sd2-512,sd2-1024] [--json PATH]
    python -m bench.page --model PATH --sections model-512,model-1024   # a real model (bench/gpu.sh)

Two kinds of caller, alternated (A B B A ...) on one server per section, the same requests each:

- ``api``: a program, live previews off; it fetches its final PNG;
- ``page``: what the page asks for, live previews on; like the browser it fetches every preview
  as its progress message names it, then the final PNG.

Sections, each on its own server (the app's default model side: the model in its own process):
the simulated SD 1.5-like device (``sim:cpu_ms=5,dev_ms=12,decode_ms=15``, 20 steps: it carries
latents of the real shape and makes previews as a real model does) at 512 and 1024 px, and the
tiny random-weight SD 2 build of ``tests/families.py`` (``sd2-v``) at 512 px (8 steps) and 1024
px (4 steps). ``--max-batch-size 1``: one request per inference, like for like with the raw
device.

Figures per caller kind: the **server process's** CPU per job (the one GIL that serves every
caller) and per step (per job over the steps; and the marginal step, from an API round at 1
step), the whole process tree's CPU per job, images/s, the previews fetched and their mean size;
page / api ratios; on the simulated device the device's own rate called back to back (no server,
``bench.fast.device_rate``) and app / raw. No thresholds: the figures go to the table and ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import loadgen
from bench.fast import device_rate, tree_cpu_seconds
from bench.harness import Server

SIM = "sim:cpu_ms=5,dev_ms=12,decode_ms=15,size={size},steps=20"
KINDS = ("api", "page")
CLIENTS = 4


@dataclass(frozen=True)
class Section:
    name: str
    model: str  # a sim: spec, or "sd2-v" (built into a folder when the section runs)
    size: int
    steps: int
    jobs: int  # requests per round and kind

    @property
    def simulated(self) -> bool:
        return self.model.startswith("sim:")


SECTIONS = {
    "sim-512": Section("sim-512", SIM.format(size=512), 512, 20, 24),
    "sim-1024": Section("sim-1024", SIM.format(size=1024), 1024, 20, 24),
    "sd2-512": Section("sd2-512", "sd2-v", 512, 8, 8),
    "sd2-1024": Section("sd2-1024", "sd2-v", 1024, 4, 4),
    # --model PATH (bench/gpu.sh: the full-size SD 1.5 build on the GPU)
    "model-512": Section("model-512", "--model", 512, 20, 16),
    "model-1024": Section("model-1024", "--model", 1024, 20, 8),
}
QUICK = ("sim-512", "sd2-512")
FAMILIES = ("sd2-v",)  # built by tests/families.py when its section runs


def data(k: int, size: int, steps: int, previews: bool) -> list[Any]:
    """The ``/generate`` inputs of the k-th request (``loadgen.generate_data``), previews on or off."""
    from pipeline.request import FIELDS

    inputs = loadgen.generate_data(k, size, steps)
    inputs[FIELDS.index("live_preview")] = previews
    return inputs


async def closed_loop(url: str, section: Section, kind: str, n: int, steps: int, first: int) -> dict[str, Any]:
    """``n`` requests from CLIENTS callers, each sending its next when its last is answered."""
    previews: list[int] = []
    outcomes: list[loadgen.Outcome] = []
    limits = httpx.Limits(max_connections=4 * CLIENTS, max_keepalive_connections=4 * CLIENTS)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        fn_index, trigger_id = await loadgen._endpoint(http, url, "generate")
        counter = iter(range(n))
        t0 = time.perf_counter()

        async def caller() -> None:
            session = uuid.uuid4().hex[:11]
            for k in counter:
                outcomes.append(await loadgen.async_request(
                    http, url, fn_index, trigger_id, session, data(first + k, section.size, steps, kind == "page"),
                    fetch=True, previews=previews if kind == "page" else None))  # fmt: skip

        await asyncio.gather(*(caller() for _ in range(CLIENTS)))
        seconds = time.perf_counter() - t0
    good = sum(1 for o in outcomes if o.ok)
    return {"ok": good, "errors": len(outcomes) - good, "seconds": seconds, "previews": previews}


def cpu_of(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def measured_round(server: Server, section: Section, kind: str, n: int, steps: int, first: int) -> dict[str, Any]:
    pid = server.proc.pid
    own, tree = cpu_of(pid), tree_cpu_seconds(pid)
    result = asyncio.run(closed_loop(server.url, section, kind, n, steps, first))
    result["server_cpu_s"] = cpu_of(pid) - own
    result["tree_cpu_s"] = tree_cpu_seconds(pid) - tree
    return result


def figures(rounds: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """One kind's rounds summed: CPU per job and per step, images/s, previews per job and their size."""
    jobs = sum(r["ok"] for r in rounds)
    previews = [size for r in rounds for size in r["previews"]]
    per_job = 1000 * sum(r["server_cpu_s"] for r in rounds) / max(1, jobs)
    return {
        "jobs": jobs,
        "errors": sum(r["errors"] for r in rounds),
        "server_cpu_ms_per_job": per_job,
        "server_cpu_ms_per_step": per_job / steps,
        "tree_cpu_ms_per_job": 1000 * sum(r["tree_cpu_s"] for r in rounds) / max(1, jobs),
        "images_per_second": jobs / max(1e-9, sum(r["seconds"] for r in rounds)),
        "previews_per_job": len(previews) / max(1, jobs),
        "preview_kb": statistics.fmean(previews) / 1024 if previews else None,
        "failed_previews": sum(1 for size in previews if size < 0),
    }


def run_section(section: Section, rounds: int, tmp: Path) -> dict[str, Any]:
    model = section.model
    if model in FAMILIES:
        from tests.families import build_family

        model = str(build_family(model, tmp / model))
    flags = ("--model", model, "--max-batch-size", "1", "--max-size", str(section.size),
             "--max-pixel-steps", str(10**12))  # fmt: skip
    server = Server("gated", tmp / section.name, *flags)
    try:
        asyncio.run(closed_loop(server.url, section, "page", CLIENTS, section.steps, 10**6))  # warm: both paths
        marginal = measured_round(server, section, "api", section.jobs, 1, 2 * 10**6)  # the 1-step job's cost
        by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for r in range(rounds):
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                by_kind[kind].append(measured_round(server, section, kind, section.jobs, section.steps, r * 1000))
    finally:
        server.close()
    out: dict[str, Any] = {"section": section.name, "model": section.model, "size": section.size,
                           "steps": section.steps, "clients": CLIENTS, "rounds": rounds}  # fmt: skip
    out.update({kind: figures(by_kind[kind], section.steps) for kind in KINDS})
    one_step = 1000 * marginal["server_cpu_s"] / max(1, marginal["ok"])
    out["api_one_step_server_cpu_ms"] = one_step
    out["marginal_step_server_cpu_ms"] = (out["api"]["server_cpu_ms_per_job"] - one_step) / max(1, section.steps - 1)
    out["page_over_api_server_cpu"] = out["page"]["server_cpu_ms_per_job"] / out["api"]["server_cpu_ms_per_job"]
    out["page_over_api_tree_cpu"] = out["page"]["tree_cpu_ms_per_job"] / out["api"]["tree_cpu_ms_per_job"]
    if section.simulated:
        raw = device_rate(section.model, 2 * section.jobs)
        out["raw_images_per_second"] = raw
        for kind in KINDS:
            out[kind]["app_over_raw"] = out[kind]["images_per_second"] / raw if raw else None
    return out


def render(result: dict[str, Any]) -> str:
    def f(value: Any, fmt: str = ".1f") -> str:
        return "-" if value is None else format(value, fmt)

    lines = [f"Page users against API users ({result['cores']} cores, {result['seconds']:.0f} s, "
             f"{CLIENTS} callers of one kind at a time, --max-batch-size 1, the model in its own process)", "",
             "| section | caller | server CPU ms / job | ms / step | marginal ms / step (API) | tree CPU ms / job | "
             "img/s | app / raw | previews / job (KB each) | page / API: server CPU | tree CPU | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in result["sections"]:
        for kind in KINDS:
            k = s[kind]
            page = kind == "page"
            lines.append(
                f"| {s['section']} ({s['steps']} steps) | {kind} | {k['server_cpu_ms_per_job']:.1f} | "
                f"{k['server_cpu_ms_per_step']:.2f} | {f(s['marginal_step_server_cpu_ms'], '.2f') if not page else ''} | "
                f"{k['tree_cpu_ms_per_job']:.0f} | {k['images_per_second']:.2f} | {f(k.get('app_over_raw'), '.3f')} | "
                f"{k['previews_per_job']:.1f} ({f(k['preview_kb'])}) | "
                f"{f(s['page_over_api_server_cpu'], '.2f') if page else ''} | "
                f"{f(s['page_over_api_tree_cpu'], '.2f') if page else ''} | {k['errors'] + k['failed_previews']} |"
            )
    return "\n".join(lines)


def errors_of(result: dict[str, Any]) -> int:
    return sum(s[k]["errors"] + s[k]["failed_previews"] for s in result["sections"] for k in KINDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"sections {', '.join(QUICK)}, two rounds a kind")
    parser.add_argument("--sections", default=None, help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per caller kind (default 4, quick 2)")
    parser.add_argument("--jobs", type=int, default=None, help="requests per round (default: the section's)")
    parser.add_argument("--model", default=None, help="a model folder or hub id for the model-* sections")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    default = [n for n in (QUICK if args.quick else SECTIONS) if not n.startswith("model-")]
    names = args.sections.split(",") if args.sections else default
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    rounds = args.rounds or (2 if args.quick else 4)
    started = time.monotonic()
    sections: list[dict[str, Any]] = []
    result: dict[str, Any] = {"cores": psutil.cpu_count(), "sections": sections, "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="bench-page-") as tmp:
        for name in names:
            section = SECTIONS[name]
            if section.model == "--model":
                if not args.model:
                    parser.error(f"section {name} needs --model")
                section = Section(section.name, args.model, section.size, section.steps, section.jobs)
            if args.jobs:
                section = Section(section.name, section.model, section.size, section.steps, args.jobs)
            sections.append(run_section(section, rounds, Path(tmp)))
            # Each section's figures as soon as it ends (a run cut short by a time limit keeps them).
            result = {"cores": psutil.cpu_count(), "sections": sections, "seconds": time.monotonic() - started}
            print(render({**result, "sections": sections[-1:]}), flush=True)
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(result, indent=1))
    return 0 if errors_of(result) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

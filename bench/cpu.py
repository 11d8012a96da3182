"""Server CPU per request on the null device, measured in alternated windows (issue 17's CPU target).

    python -m bench.cpu [--rounds 10] [--seconds 5] [--clients 8] [--client async|gradio]
                        [--configs process,thread,floor] [--against DIR] [--json PATH]

On a shared 2-core machine one round of ``bench.fast`` cannot settle a figure of about 15 ms: the
host's speed moves it by a quarter within minutes (the same code read 15 and 20 ms an hour apart).
Here every configuration runs as its own server, all started at once and warmed, and each round
measures every one of them for ``--seconds`` in turn (the order reversed every other round), so
the machine's drift falls on all of them alike. Reported per configuration: the median and
quartiles over the rounds, and the median of its paired ratio to the first configuration.

Configurations (``--model sim:cpu_ms=0,dev_ms=0,decode_ms=0,size=512,steps=1``, the null device,
``--max-batch-size 1``):

- ``process`` / ``thread``: this checkout's ``python app.py`` with that ``--model-side``;
- ``floor``: ``bench.floor``, a Gradio app of the same API shape that only encodes a 512 px picture
  with the app's PNG writer: what Gradio and the PNG cost, so what is left is the app's own;
- ``against``: with ``--against DIR``, another checkout's app (an older commit), model process.

The server's CPU is its whole process tree's (a model process counts), over the load generator's
window (``bench.loadgen``, ``--client async`` by default: one asyncio loop, the lightest caller,
so the server gets the most of the two cores). No thresholds: figures for the table (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import loadgen
from bench.fast import tree_cpu_seconds
from bench.servers import ONE_ADDRESS

ROOT = Path(__file__).resolve().parent.parent
NULL = "sim:cpu_ms=0,dev_ms=0,decode_ms=0,size=512,steps=1"
CONFIGS = ("process", "thread", "floor", "against")


@dataclass
class Config:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    ms: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(name: str, tmp: Path, against: Path | None = None) -> Config:
    port = _port()
    env = {
        **os.environ,
        **ONE_ADDRESS,
        "HF_HUB_OFFLINE": "1",
        "T2I_OUTPUT_DIR": str(tmp / f"out-{name}"),
        "GRADIO_TEMP_DIR": str(tmp / f"gradio-{name}"),
    }
    if name == "floor":
        cmd, cwd = [sys.executable, "-m", "bench.floor", "--port", str(port)], ROOT
    else:
        side = "thread" if name == "thread" else "process"
        cmd = [
            sys.executable,
            "app.py",
            "--model",
            NULL,
            "--model-side",
            side,
            "--max-batch-size",
            "1",
            "--concurrency",
            "64",
            "--queue-size",
            "256",
            "--port",
            str(port),
        ]
        cwd = against if name == "against" and against is not None else ROOT
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}) before it was ready")
        try:
            if httpx.get(url + "config", timeout=2).status_code == 200:
                return Config(name, proc, url)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} was not ready within 300 s")
        time.sleep(0.2)


def window(config: Config, clients: int, client: str, seconds: float) -> None:
    """One measured window: requests answered, and the server tree's CPU over the same window."""
    marks: dict[str, float] = {}
    result = loadgen.run(
        config.url,
        clients,
        client=client,
        seconds=seconds,
        size=512,
        steps=1,
        on_start=lambda: marks.update(cpu0=tree_cpu_seconds(config.proc.pid)),
    )
    cpu = tree_cpu_seconds(config.proc.pid) - marks["cpu0"]
    if result.errors or not result.count:
        raise RuntimeError(f"{config.name}: {result.errors} errors, {result.error_messages[:2]}")
    config.ms.append(cpu / result.count * 1000)
    config.rates.append(result.images_per_second)


def quartiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def run(
    configs: tuple[str, ...], rounds: int, seconds: float, clients: int, client: str, against: Path | None
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    started: list[Config] = []
    try:
        for name in configs:
            started.append(start(name, tmp, against))
        for config in started:  # warm: every code path, the picture pool, the connection pools
            loadgen.run(config.url, clients, client=client, n=max(40, 4 * clients), size=512, steps=1)
            window(config, clients, client, min(2.0, seconds))
            config.ms.clear()
            config.rates.clear()
        for r in range(rounds):
            for config in started if r % 2 == 0 else started[::-1]:
                window(config, clients, client, seconds)
            print(
                f"round {r + 1}/{rounds}: " + ", ".join(f"{c.name} {c.ms[-1]:.2f} ms" for c in started),
                file=sys.stderr,
                flush=True,
            )
    finally:
        for config in started:
            config.proc.terminate()
        for config in started:
            try:
                config.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                config.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)  # the servers' images: gigabytes over a run
    base = started[0]
    return {
        "rounds": rounds,
        "seconds": seconds,
        "clients": clients,
        "client": client,
        "model": NULL,
        "reference": base.name,
        "against": str(against) if against else None,
        "machine": {"cores": psutil.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "configs": {
            c.name: {
                "ms_per_request": c.ms,
                "images_per_second": c.rates,
                **quartiles(c.ms),
                "ratio_to_reference": quartiles([a / b for a, b in zip(c.ms, base.ms)]),
            }
            for c in started
        },
    }


def render(result: dict[str, Any]) -> str:
    ref = result["reference"]
    lines = [
        f"Server CPU per request, null device, 512 px ({result['rounds']} alternated rounds of "
        f"{result['seconds']:g} s, {result['clients']} {result['client']} callers, "
        f"{result['machine']['cores']} cores)",
        "",
        f"| configuration | CPU per request ms, median | quartiles | paired ratio to {ref}, median (quartiles) "
        "| images/s, median |",
        "|---|---|---|---|---|",
    ]
    for name, c in result["configs"].items():
        r = c["ratio_to_reference"]
        lines.append(
            f"| {name} | {c['median']:.2f} | {c['q1']:.2f}-{c['q3']:.2f} | "
            f"{r['median']:.3f} ({r['q1']:.3f}-{r['q3']:.3f}) | {statistics.median(c['images_per_second']):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--client", choices=loadgen.CLIENTS, default="async")
    parser.add_argument(
        "--configs",
        type=lambda v: tuple(v.split(",")),
        default=None,
        help="comma-separated, of process, thread, floor (and against, with --against); "
        "the first is the reference of the ratios",
    )
    parser.add_argument("--against", type=Path, default=None, help="another checkout of this app (an older commit)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    configs = args.configs or ("process", "thread", "floor", *(("against",) if args.against else ()))
    if not set(configs) <= set(CONFIGS) or ("against" in configs) != (args.against is not None):
        parser.error("configs are process, thread, floor, and against exactly when --against is given")
    result = run(configs, args.rounds, args.seconds, args.clients, args.client, args.against)
    print(render(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

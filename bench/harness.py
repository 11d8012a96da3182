"""The benchmark's harness: one app design in a subprocess (``Server``), the raw pipeline in its own
(``Raw``), and the run's facts (``fn_index_of``, ``versions``); every benchmark of ``bench/`` runs on it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.servers import ONE_ADDRESS

ROOT = Path(__file__).resolve().parent.parent
# Requests to the servers on this machine go straight there: a machine whose environment names an
# HTTP proxy (the lent GPU machine may) would otherwise send them, and Gradio's own startup check, to it.
LOCAL_DIRECT = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
os.environ.update(LOCAL_DIRECT)
# The checkout whose app the servers run: this one, or another (an older commit) named by
# T2I_BENCH_APP_ROOT, so that one benchmark's client side measures both against the same device.
APP_ROOT = Path(os.environ.get("T2I_BENCH_APP_ROOT") or ROOT)


class Server:
    """One app design in a subprocess on a free port, with an RSS sampler."""

    def __init__(self, design: str, tmp: Path, *extra: str, start: bool = True) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, **ONE_ADDRESS, "HF_HUB_OFFLINE": "1", "T2I_OUTPUT_DIR": str(tmp / f"out-{design}")}
        env.update(LOCAL_DIRECT)
        if design != "gated":  # the app itself keeps Gradio's cache in its output folder, as users run it
            env["GRADIO_TEMP_DIR"] = str(tmp / f"gradio-{design}")
        else:
            env.pop("GRADIO_TEMP_DIR", None)
        self.started = time.monotonic()
        tmp.mkdir(parents=True, exist_ok=True)
        self.log = tmp / f"server-{design}-{self.port}.log"  # its stderr: why it died, if it dies
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.servers", "--design", design, "--port", str(self.port), *extra],
            cwd=APP_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
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
        else:  # its output ended without READY: it died starting; say why rather than fail at the first request
            self.proc.wait(timeout=15)
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the {self.url} server exited ({self.proc.returncode}) before READY:\n{tail}")
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

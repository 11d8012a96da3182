"""Hostile clients against two checkouts side by side (issue 46): what one small request costs everyone else.

    python -m bench.hostile [--against DIR] [--rounds N] [--json FILE]

Each attack goes alone to each server (this checkout's app; with ``--against``, another checkout's,
an older commit, started the same way), the servers alternated round by round (ABBA), with two
bystanders in a process of their own (``bystanders``): ``/health`` every 50 ms (its worst
latency), and another identity's small txt2img again and again (its slowest, over its idle time).
Per attack and server: those two, the server process's CPU seconds during the attack, and its
resident memory after the attack over before.

The attacks are the round-three ones (``tests/server/test_hostile_round_three.py`` sends them at
the caps), sized here so that the old design ends each in seconds:

- ``json``: 32 KiB of JSON, 65 brackets then an unclosed string of ``\\"`` (``/sdapi/v1/txt2img``);
- ``lora``: a 16 KiB prompt ``<lora:a:000…`` (``/sdapi/v1/txt2img``);
- ``apng``: an APNG of 5,000 frames on a 1024 px canvas to ``png-info``;
- ``scans``: a 2048 px JPEG of 2,000 scans as img2img's ``init_images``;
- ``inpaints``: 24 inpaints at once from one identity, each a 2048 px picture of 85 KB and its mask;
- ``bodies``: six img2img bodies of 51 MiB at once, from six identities.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import psutil

from bench.harness import versions

ROOT = Path(__file__).resolve().parent.parent
VICTIM = {"prompt": "a blue square", "seed": 1, "steps": 8, "width": 128, "height": 128, "cfg_scale": 5}

# The two bystanders, run as ``python -m bench.hostile --bystanders URL MODE``: /health every 50 ms
# from 127.0.0.88, and another identity's txt2img from 127.0.0.77 again and again, until stdin
# closes; then their figures as one JSON line. A process of their own: the attackers' threads (which
# encode and send megabytes) must not be in the bystanders' times.


def _client(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=120)


def _run_bystanders(url: str, mode: str) -> None:
    stop = threading.Event()
    health = {"worst": 0.0, "errors": 0}

    def probe() -> None:
        with _client("127.0.0.88") as http:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    ok = http.get(url + "health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health["worst"] = max(health["worst"], time.perf_counter() - start)
                health["errors"] += not ok
                stop.wait(0.05)

    def victim(http: httpx.Client) -> float:
        start = time.perf_counter()
        answer = http.post(url + "sdapi/v1/txt2img", json=VICTIM)
        assert answer.status_code == 200 and answer.json()["images"], answer.text[:300]
        return time.perf_counter() - start

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    prober = threading.Thread(target=probe, name="health-probe")
    with _client("127.0.0.77") as http:
        if mode == "idle":
            times = [victim(http) for _ in range(4)][1:]  # the first one warms up
        else:
            prober.start()
            times = [victim(http)]
            while not stop.is_set():
                times.append(victim(http))
            prober.join()
    print(json.dumps({**health, "times": times}))


@contextlib.contextmanager
def bystanders(url: str, mode: str = "attack") -> Iterator[dict[str, Any]]:
    """The bystanders' process while the block runs (``mode`` "idle": three requests alone); their
    figures, filled in after it: ``worst`` and ``errors`` of /health, the victim's ``times``."""
    seen: dict[str, Any] = {}
    proc = subprocess.Popen([sys.executable, "-m", "bench.hostile", "--bystanders", url, mode], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if mode == "attack":
            time.sleep(0.5)  # its interpreter up, probing and drawing
        yield seen
    finally:
        out, _ = proc.communicate("", timeout=300)
    seen.update(json.loads(out.strip().splitlines()[-1]))


def idle_seconds(url: str) -> float:
    """The victim's request alone: the median of three, after one to warm up."""
    with bystanders(url, "idle") as seen:
        pass
    return float(statistics.median(seen["times"]))


def attack_threads(attacks: list[Callable[[], None]]) -> list[BaseException]:
    """Run ``attacks`` at once, each on its own thread at the lowest CPU priority (an attacker elsewhere
    costs this machine nothing to send its bytes; here it shares the cores with the server); the
    failures of their own checks."""
    failures: list[BaseException] = []

    def guarded(attack: Callable[[], None]) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            attack()
        except BaseException as exc:  # reported by the caller, with the others
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(a,), name=f"attack-{i}") for i, a in enumerate(attacks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    return failures


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def peer(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=600)


def posting(url: str, path: str, body: bytes, address: str) -> Callable[[], None]:
    """An attack: ``body`` (JSON bytes, built before the clock starts) POSTed from ``address``."""

    def send() -> None:
        with peer(address) as http:
            http.post(url + path, content=body, headers={"content-type": "application/json"})

    return send


def attacks(url: str) -> dict[str, list[Callable[[], None]]]:
    from PIL import Image

    from tests import malformed

    common = {"prompt": "a cat", "width": 64, "height": 64, "steps": 4}
    picture = malformed.smooth_jpeg(2048)  # 85 KB on the wire, 4 MP to decode
    black = malformed.png_bytes(Image.new("L", (2048, 2048)))
    fake = b64(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (19 * 2**20 // 256))
    txt2img, img2img = "sdapi/v1/txt2img", "sdapi/v1/img2img"
    inpaint = json.dumps({**common, "init_images": [b64(picture)], "mask": b64(black)}).encode()
    big = json.dumps({**common, "init_images": [fake], "mask": fake}).encode()
    scans = malformed.many_scan_jpeg(scans=2_000, side=2048)
    return {
        "json": [posting(url, txt2img, b"[" * 65 + b'"' + b'\\"' * (16 * 1024), "127.0.1.1")],
        "lora": [posting(url, txt2img, json.dumps({"prompt": "<lora:a:" + "0" * 16 * 1024}).encode(), "127.0.2.1")],
        "apng": [
            posting(
                url,
                "sdapi/v1/png-info",
                json.dumps({"image": b64(malformed.animated_png(frames=5_000, side=1024, text="a cat"))}).encode(),
                "127.0.3.1",
            )
        ],
        "scans": [posting(url, img2img, json.dumps({**common, "init_images": [b64(scans)]}).encode(), "127.0.4.1")],
        "inpaints": [posting(url, img2img, inpaint, "127.0.5.1")] * 24,
        "bodies": [posting(url, img2img, big, f"127.0.6.{k}") for k in range(1, 7)],
    }


class App:
    """``python app.py`` from a checkout, on a free port; its process for CPU and memory."""

    def __init__(self, root: Path, tmp: Path) -> None:
        from tests.helpers import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp / "gradio"), "T2I_OUTPUT_DIR": str(tmp / "out"),
               "HF_HUB_OFFLINE": "1", "NO_PROXY": "*"}  # fmt: skip
        tmp.mkdir(parents=True, exist_ok=True)
        self.log = (tmp / "server.log").open("w")
        self.proc = subprocess.Popen([sys.executable, "app.py", "--port", str(self.port), "--rate-limit", "100"],
                                     cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, f"the app in {root} exited"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "health", timeout=2).json()["status"] == "ok":
                    break
            assert time.monotonic() < deadline, f"the app in {root} never became ready"
            time.sleep(0.2)

    def cpu(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def measure(app: App, idle: float, attack: list[Callable[[], None]]) -> dict[str, Any]:
    rss, cpu = app.ps.memory_info().rss, app.cpu()
    with bystanders(app.url) as seen:
        failures = attack_threads(attack)
    time.sleep(1.0)  # the last answers' buffers released
    return {
        "health_worst_s": round(seen["worst"], 3),
        "health_errors": seen["errors"],
        "victim_over_idle": round(max(seen["times"]) / idle, 2),
        "server_cpu_s": round(app.cpu() - cpu, 2),
        "memory_after_mb": round((app.ps.memory_info().rss - rss) / 2**20),
        "attack_errors": [repr(f)[:200] for f in failures],
    }


def run(against: Path | None, rounds: int) -> dict[str, Any]:
    roots = {"this": ROOT, **({"against": against} if against else {})}
    with tempfile.TemporaryDirectory() as tmp:
        apps = {name: App(root, Path(tmp) / name) for name, root in roots.items()}
        try:
            idle = {name: idle_seconds(app.url) for name, app in apps.items()}
            rows: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in apps}
            names = list(attacks(apps["this"].url))
            for k in range(rounds):
                order = list(apps) if k % 2 == 0 else list(reversed(apps))
                for name in order:
                    plan = attacks(apps[name].url)
                    for attack in names:
                        row = measure(apps[name], idle[name], plan[attack])
                        rows[name].setdefault(attack, []).append(row)
                        print(name, attack, row, flush=True)
        finally:
            for app in apps.values():
                app.close()
    worst = {name: {attack: {key: max(r[key] for r in got) for key in got[0] if key != "attack_errors"}
                    for attack, got in by.items()} for name, by in rows.items()}  # fmt: skip
    return {"what": "hostile round three: each attack alone, bystanders beside it (worst over rounds)",
            "idle_s": idle, "rounds": rounds, "designs": worst, "runs": rows,
            "against": str(against) if against else None, "cores": os.cpu_count(), "versions": versions()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, default=None, help="another checkout of this app (an older commit)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--bystanders", nargs=2, metavar=("URL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bystanders:
        _run_bystanders(*args.bystanders)
        return 0
    result = run(args.against, args.rounds)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    for name, by in result["designs"].items():
        for attack, row in by.items():
            print(f"{name:8} {attack:9} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Admission bound, load and soak against a real server process on the tiny model (the soak: two models,
the embedded one and a tiny SD 1.5 build, under a device budget that fits one, the clients alternating).

CI runs the short versions; ``python -m pytest -m slow`` runs the long ones.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import psutil
import pytest

from tests.fakes import WAIT, FakeModel
from tests.families import built_family
from tests.helpers import ROOT, free_port, raw_request, running_app, wait_for

OUTPUT_BUDGET_MB = 1


def test_queue_full_rejects_exactly_the_excess_at_once(tmp_path: Path) -> None:
    """``--concurrency`` + ``--queue-size`` requests are admitted, every one into the handler and the
    app's fair line (none waits in Gradio's queue); the next ones are told "queue full" at once."""
    from gradio_client import Client

    # Under the other worker's load the four submits once took longer than the held job's 30 s (it failed,
    # and the four were never in at once): the hold and the wait are generous, the check is the count.
    model = FakeModel(hold=True, hold_wait=150)
    # One image a job: with batching, a submit that reached the line before the first job opened would
    # share it (the full run once saw two run and two wait, never "one runs and three wait").
    args = ("--queue-size", "2", "--concurrency", "2", "--max-waiting-per-user", "10", "--max-batch-size", "1")
    with running_app(tmp_path, *args, load=lambda: model) as (url, _d, _a):
        seen: list[Any] = [None]  # the last health read, for the message if a wait times out

        def health() -> Any:
            seen[0] = httpx.get(url + "health").json()
            return seen[0]

        # One client for all (a fresh one per request fetched the app's config each time; under the other
        # worker's load one such fetch ran past httpx's 5 s: conftest's _patient_gradio_client).
        client = Client(url, verbose=False)
        admitted = [client.submit(**raw_request(seed=i), api_name="/generate") for i in range(4)]
        in_handler = lambda: health()["requests_in_flight"] == 4  # noqa: E731
        wait_for(in_handler, "four requests are in the handler", timeout=120, every=0.05, about=lambda: seen[0])
        in_line = lambda: health()["gpu_queue_depth"] == 3  # noqa: E731
        wait_for(in_line, "one runs and three wait in the fair line", timeout=60, every=0.05, about=lambda: seen[0])
        assert health()["queue_depth"] == 3  # nothing in Gradio's own queue
        rejected = []
        for i in range(4, 7):
            started = time.monotonic()
            with pytest.raises(Exception, match="(?i)queue is full") as info:
                client.predict(**raw_request(seed=i), api_name="/generate")
            rejected.append((type(info.value).__name__, time.monotonic() - started))
        assert len(model.calls) == 1  # the rejections never touched the model
        for _ in range(4):
            model.release.release()
        results = [job.result(timeout=WAIT) for job in admitted]
    assert [r[1]["status"] for r in results] == ["done"] * 4
    assert all(seconds < 10 for _, seconds in rejected), rejected


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, psutil.Process, list[Path]]]:
    tmp = tmp_path_factory.mktemp("soak")
    port = free_port()
    env = {
        **os.environ,
        "GRADIO_TEMP_DIR": str(tmp / "gradio"),
        "T2I_OUTPUT_DIR": str(tmp / "out"),
        "HF_HUB_OFFLINE": "1",
    }
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "app.py",
            "--port",
            str(port),
            "--output-max-mb",
            str(OUTPUT_BUDGET_MB),
            # files younger than the interval are kept (at most 10 s): long enough for the clients to fetch them
            "--sweep-interval",
            "2",
            # two models, a device budget that fits one: the clients alternate, so the soak moves them (issue 52)
            "--model",
            "embedded-default",
            "--model",
            f"tiny={built_family('sd1')}",
            "--device-memory-budget",
            "8",
            # many load clients share one address here, where each would be its own person
            "--rate-limit",
            "1000",
            "--max-connections-per-address",
            "1000",
            "--max-sessions-per-user",
            "1000",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: _healthy(url), "the server is up", timeout=90)
        yield url, psutil.Process(proc.pid), [tmp / "gradio", tmp / "out"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "health", timeout=2).json()["status"] == "ok"
    except httpx.HTTPError:
        return False


def _run_clients(
    url: str, clients: int, *, seconds: float | None = None, total: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    from gradio_client import Client

    infos: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds if seconds else None
    counter = iter(range(10**9))

    def worker(k: int) -> None:
        client = Client(url, verbose=False)
        while True:
            with lock:
                n = next(counter)
            if (end and time.monotonic() > end) or (total is not None and n >= total):
                return
            try:
                model = ("embedded-default", "tiny")[n % 2]  # users alternating between the two models
                _, info = client.predict(
                    **raw_request(seed=n, num_inference_steps=3, model=model), api_name="/generate"
                )
                with lock:
                    infos.append(info)
            except Exception as exc:
                with lock:
                    errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(k,), name=f"load-client-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return infos, errors


def _assert_one_inference_at_a_time(infos: list[dict[str, Any]], max_images: int = 4) -> None:
    """One inference on the GPU at a time: a job-level batch's requests share its span exactly and
    distinct jobs never overlap; in a step-level loop members overlap, but at no instant does the
    GPU hold more than ``max_images`` images (``--max-batch-size``) or requests of another shape."""
    jobs = [i for i in infos if i.get("batching", "job") == "job"]
    spans = sorted({(i["timings"]["infer_start"], i["timings"]["infer_end"]) for i in jobs})
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, "two inferences overlapped"
    for i in infos:
        t = i["timings"]["infer_start"]
        inside = [o for o in infos if o["timings"]["infer_start"] <= t < o["timings"]["infer_end"]]
        assert sum(o["num_images"] for o in inside) <= max_images, f"{len(inside)} requests on the GPU at once"
        assert len({(o["width"], o["height"], o["scheduler"], o.get("batching", "job")) for o in inside}) <= 1
        if i.get("batching") == "step":  # joined a loop: never beside a job-level inference
            assert all(o.get("batching") == "step" for o in inside)


@pytest.mark.parametrize("seconds", [pytest.param(8, id="short"), pytest.param(120, id="long", marks=pytest.mark.slow)])
def test_load_several_clients_for_a_fixed_time(server: tuple[str, psutil.Process, list[Path]], seconds: float) -> None:
    url, _, _ = server
    infos, errors = _run_clients(url, clients=4, seconds=seconds)
    assert errors == []
    assert len(infos) >= 4 and all(i["status"] == "done" for i in infos)
    _assert_one_inference_at_a_time(infos)


@pytest.mark.parametrize(
    "requests", [pytest.param(200, id="short"), pytest.param(3000, id="long", marks=pytest.mark.slow)]
)
def test_soak_memory_and_files_level_off(server: tuple[str, psutil.Process, list[Path]], requests: int) -> None:
    url, process, folders = server
    warmup, _ = _run_clients(url, clients=4, total=50)
    rss_after_warmup = process.memory_info().rss
    # the model process (the largest child): every model, moved on and off the device
    model_side = max(process.children(), key=lambda child: child.memory_info().rss)
    model_after_warmup = model_side.memory_info().rss
    moves_before = sum(m["moves"] for m in httpx.get(url + "health", timeout=10).json()["models"])
    infos, errors = _run_clients(url, clients=4, total=requests)
    rss_end, model_end = process.memory_info().rss, model_side.memory_info().rss
    assert errors == [] and len(infos) == requests
    _assert_one_inference_at_a_time(warmup + infos)
    # Memory: growth after warm-up stays under 15% (+16 MiB of allocator slack).
    assert rss_end <= rss_after_warmup * 1.15 + 16 * 2**20, (rss_after_warmup, rss_end)
    assert model_end <= model_after_warmup * 1.15 + 16 * 2**20, (model_after_warmup, model_end)
    assert {i["model"] for i in infos} == {"embedded-default", "tiny"}
    assert sum(m["moves"] for m in httpx.get(url + "health", timeout=10).json()["models"]) > moves_before
    # Disk: after one more sweep, the kept output stays within the budget.
    produced = sum(i["num_images"] for i in warmup + infos)
    # (a sweep every 2 s keeps files up to 10 s old; 30 s leaves room for a busy machine: 15 s ran out once)
    wait_for(lambda: _disk(folders)[1] <= OUTPUT_BUDGET_MB * 2**20, "the sweeper brings the disk within budget", 30)
    files, _bytes = _disk(folders)
    # Without the sweeper two copies of every image stay (Gradio's and the output folder's); how many fit
    # the budget depends on the PNGs' size (the retrained model's flat colours compress to about 4 KB).
    assert files < 2 * produced, (files, produced)
    metrics = httpx.get(url + "metrics", timeout=10).text
    assert float(re.search(r"^output_bytes (\S+)$", metrics, re.M).group(1)) <= OUTPUT_BUDGET_MB * 2**20


def _disk(folders: list[Path]) -> tuple[int, int]:
    """Files and bytes under ``folders``, counted while the server's sweeper deletes some of them."""
    sizes = []
    for folder in folders:
        # os.walk skips a folder that vanishes under it (rglob raises FileNotFoundError).
        for root, _dirs, files in os.walk(folder, onerror=lambda _error: None):
            for name in files:
                try:
                    sizes.append(os.stat(os.path.join(root, name)).st_size)
                except FileNotFoundError:
                    continue
    return len(sizes), sum(sizes)

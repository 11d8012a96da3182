"""The load generator's ``gradio`` client: closed-loop callers on ``gradio_client`` threads, the way
a program using the Python client calls the app (``bench.loadgen.run(client="gradio")``)."""

from __future__ import annotations

import itertools
import tempfile
import threading
import time
from typing import Any, Callable

from bench.loadgen import LoadResult, Outcome, Window, _image_urls, _result, generate_data


def run_gradio(
    url: str,
    clients: int,
    *,
    n: int | None = None,
    seconds: float | None = None,
    min_seconds: float | None = None,
    size: int = 512,
    steps: int = 1,
    fetch: bool = False,
    api_name: str = "generate",
    data: Callable[[int], list[Any]] | None = None,
    on_start: Callable[[], None] | None = None,
) -> LoadResult:
    """``clients`` ``gradio_client.Client`` threads; see ``run``."""
    from gradio_client import Client

    make = data or (lambda k: generate_data(k, size, steps))
    download: str | bool = tempfile.mkdtemp(prefix="loadgen-") if fetch else False
    cpu0 = time.process_time()
    # ssl_verify=False on plain http: gradio_client opens a new httpx client per call and loading the
    # CA bundle costs ~30 ms of CPU each time (see bench.probe.predict_many).
    made = [
        Client(url, verbose=False, download_files=download, ssl_verify=not url.startswith("http://"))
        for _ in range(clients)
    ]
    setup_cpu = time.process_time() - cpu0
    if on_start is not None:
        on_start()
    counter = itertools.count()
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    t0, cpu1 = time.perf_counter(), time.process_time()
    window = Window(n, seconds, min_seconds)

    def caller(client: Any) -> None:
        while True:
            with lock:
                k = next(counter)
            if not window.more(k):
                return
            s0 = time.perf_counter()
            try:
                gallery, info = client.predict(*make(k), api_name="/" + api_name)
                urls = _image_urls([gallery])
                outcome = Outcome(
                    bool(urls),
                    (time.perf_counter() - s0) * 1000,
                    time.monotonic(),
                    None if urls else "no image in the output",
                    urls,
                    info,
                )
            except Exception as exc:  # any failure is counted and reported
                outcome = Outcome(False, (time.perf_counter() - s0) * 1000, time.monotonic(), repr(exc)[:300])
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=caller, args=(c,), name=f"loadgen-{i}") for i, c in enumerate(made)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu1
    for c in made:
        c.close()
    return _result("gradio", clients, outcomes, elapsed, cpu, setup_cpu, fetch)

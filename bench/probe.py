"""Load and probes: gradio_client threads for generation, raw HTTP for the light probes."""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import threading
import time
import uuid
from typing import Any, Iterator

import httpx


def predict_many(
    url: str,
    n: int,
    clients: int,
    *,
    size: int,
    steps: int,
    stop: threading.Event | None = None,
    finished: list[float] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` requests from ``clients`` concurrent gradio_client Clients; returns (info records, errors).

    ``finished``, if given, receives each successful request's ``time.monotonic()`` at its answer.
    """
    from gradio_client import Client

    infos: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = itertools.count()

    def worker() -> None:
        # ssl_verify=False: gradio_client opens a new httpx client for each call, and loading the CA
        # bundle for it costs ~30 ms of CPU each time; the benchmark talks plain http to localhost,
        # so skipping it only keeps the load generator off the server's cores.
        try:
            client = Client(url, verbose=False, download_files=False, ssl_verify=not url.startswith("http://"))
        except Exception as exc:
            with lock:
                errors.append(f"client: {exc!r}"[:300])
            return  # the other clients take this one's requests
        while stop is None or not stop.is_set():
            with lock:
                k = next(counter)
            if k >= n:
                return
            try:
                _, info = client.predict(
                    prompt=f"a red circle {k}",
                    negative_prompt="",
                    seed=k,
                    randomize_seed=False,
                    width=size,
                    height=size,
                    num_inference_steps=steps,
                    guidance_scale=7.5,
                    num_images=1,
                    live_preview=False,
                    api_name="/generate",
                )
                with lock:
                    infos.append(info)
                    if finished is not None:
                        finished.append(time.monotonic())
            except Exception as exc:
                with lock:
                    errors.append(repr(exc)[:300])

    threads = [threading.Thread(target=worker, name=f"bench-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return infos, errors


def steady_rate(finished: list[float], clients: int) -> float | None:
    """Requests per second while the closed loop was saturated, from the answers' times.

    A run of ``n`` requests from ``clients`` clients has two transients: at the start the first
    request meets a free gate and runs alone, and at the end fewer than ``clients`` requests are
    left. The window runs from the first answer to the answer after which fewer than ``clients``
    remain; requests answered at the window's start are not counted and those at its end are, so
    that the window holds whole jobs (a batch's members are answered together). None when the run
    is too short to have such a window.
    """
    times = sorted(finished)
    end = len(times) - clients
    if end < 1 or times[end] <= times[0]:
        return None
    start = times[0]
    counted = sum(1 for t in times if start < t <= times[end])
    return counted / (times[end] - start)


def sample_health(url: str, seconds: float, every: float = 0.02) -> list[float]:
    """Latency (ms) of GET /health, one request every ``every`` seconds."""
    out = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):  # a timed-out probe counts with the time it took
                http.get(url + "health")
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(every)
    return out


def raw_http_predict(
    url: str,
    fn_index: int,
    data: list[Any],
    timeout: float = 60.0,
    http: httpx.Client | None = None,
    session: str | None = None,
) -> dict[str, Any]:
    """One request through Gradio's queue over raw HTTP (which, unlike gradio_client, can send NaN).

    Returns the ``process_completed`` message: ``success`` plus ``output`` (data or error); a refused
    join comes back as ``success: False`` with its ``status_code``.
    """
    if http is None:
        with httpx.Client(timeout=timeout) as own:
            return raw_http_predict(url, fn_index, data, timeout, own, session)
    session = session or uuid.uuid4().hex[:12]
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session}, allow_nan=True)
    joined = http.post(url + "gradio_api/queue/join", content=body, headers={"content-type": "application/json"})
    if joined.status_code != 200:
        return {"success": False, "status_code": joined.status_code, "output": {"error": joined.text}}
    event_id = joined.json().get("event_id")
    with http.stream("GET", f"{url}gradio_api/queue/data?session_hash={session}") as stream:
        for line in _sse_lines(stream.iter_bytes()):
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed" and message.get("event_id") in (None, event_id):
                    return message
    raise RuntimeError("the stream closed without process_completed")


def _sse_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of an event stream, split on \\n only (``iter_lines`` also splits on U+0085 and U+2028,
    which JSON leaves unescaped inside a prompt)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8")
    if buffer:
        yield buffer.decode("utf-8")


def light_request(url: str, fn_index: int, http: httpx.Client | None = None) -> float:
    """Latency (ms) of a queued request that validation rejects: the lightest full trip through the queue.

    Pass a kept-alive ``http`` client, as a real caller would: a fresh ``httpx.Client`` costs more
    (its SSL context alone, ~50 ms here) than the whole trip through the server.
    """
    t0 = time.perf_counter()
    with contextlib.suppress(httpx.HTTPError, RuntimeError):  # a timed-out probe counts with the time it took
        raw_http_predict(
            url, fn_index, ["x", "", 0, False, 65, 64, 20, 7.5, 1, False, "default", "none", 1.0], http=http
        )
    return (time.perf_counter() - t0) * 1000


def pct(values: list[float]) -> dict[str, float]:
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, round(p * (len(s) - 1)))]

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99), "mean": statistics.mean(s), "n": float(len(s))}


def api_fn_index(url: str, api_name: str = "generate") -> int:
    """The ``fn_index`` of the endpoint named ``api_name``, from the app's config."""
    config = httpx.get(url + "config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)

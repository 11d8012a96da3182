"""A light load generator: Gradio's queue protocol from one asyncio client (issue 17, section 2).

    python -m bench.loadgen URL [--client async|gradio] [--clients 8] [--n 24 | --seconds 5] [--size 512]

``run(url, clients, ...)`` drives ``/generate`` with ``clients`` virtual callers, each in a closed
loop (submit, wait for the answer, submit again) until ``n`` requests in all have been sent or
``seconds`` have passed. Two drivers, one result type (``LoadResult``):

- ``async``: one event loop, one ``httpx.AsyncClient``, speaking the queue protocol as Gradio's own
  clients do (``sse_v3``): ``POST gradio_api/queue/join`` with ``{data, event_data, fn_index,
  trigger_id, session_hash}`` (the JS client's body; one session hash per virtual caller, as one
  browser tab or one ``gradio_client.Client`` has), then ``GET gradio_api/queue/data?session_hash=``
  read as server-sent events (frames split on a blank line, ``data: {json}``) until the event's
  ``process_completed``; ``estimation``, ``process_starts``, ``progress``, ``process_generating``,
  ``log`` and ``heartbeat`` are read and passed over, ``unexpected_error`` or a stream that closes
  first is an error.
- ``gradio``: ``gradio_client.Client`` threads, one per caller, built before the timed window
  (``ssl_verify=False`` on plain http, as ``bench.probe.predict_many`` does).

A request counts as a success only when the server answered ``success: true`` with at least one
image file URL (and, with ``fetch=True``, when that file came back as a PNG). ``fetch`` defaults to
False, what the benchmark's ``gradio_client`` callers do (``download_files=False``); with
``fetch=True`` the async driver GETs every image and the gradio driver lets ``gradio_client``
download it (its default behaviour outside the benchmark).

The client's own cost is ``time.process_time()`` over the timed window: the CPU of this whole
process (every thread), per request. On a 2-core machine the load generator and the server share
the cores, so a load generator that is CPU-hungry slows the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import httpx

from bench.probe import pct

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CLIENTS = ("async", "gradio")


def generate_data(k: int, size: int, steps: int, lora: str = "none", lora_scale: float = 1.0) -> list[Any]:
    """The ``/generate`` inputs, in the API's order (``pipeline.fields``), for the k-th request."""
    from pipeline import fields

    values = {**fields.defaults(), "prompt": f"a red circle {k}", "negative_prompt": "", "seed": k,
              "randomize_seed": False, "width": size, "height": size, "num_inference_steps": steps,
              "guidance_scale": 7.5, "num_images": 1, "live_preview": False, "scheduler": "default",
              "lora": lora, "lora_scale": lora_scale}  # fmt: skip
    return [values[name] for name in fields.NAMES]


@dataclasses.dataclass
class Outcome:
    """One request: when it was answered, how long it took, and what came back."""

    ok: bool
    latency_ms: float
    finished: float  # time.monotonic() at the answer
    error: str | None = None
    image_urls: list[str] = dataclasses.field(default_factory=list)
    info: dict[str, Any] | None = None
    images: list[bytes] = dataclasses.field(default_factory=list)  # only with keep_images


@dataclasses.dataclass
class LoadResult:
    client: str
    clients: int
    count: int  # requests answered with success and an image
    errors: int
    seconds: float  # the timed window: the first submit to the last answer
    images_per_second: float
    latency_ms: dict[str, float]  # p50 / p95 / p99 / mean / n over the successes
    client_cpu_seconds: float  # time.process_time() over the timed window (this process, all threads)
    client_cpu_ms_per_request: float
    setup_cpu_seconds: float  # building the clients, before the window
    fetched: bool
    error_messages: list[str]
    outcomes: list[Outcome] = dataclasses.field(repr=False)

    @property
    def finished(self) -> list[float]:
        """The successes' answer times, for ``bench.probe.steady_rate``."""
        return [o.finished for o in self.outcomes if o.ok]

    @property
    def infos(self) -> list[dict[str, Any]]:
        return [o.info for o in self.outcomes if o.ok and o.info is not None]

    def summary(self) -> dict[str, Any]:
        """The figures, without the per-request records (for JSON)."""
        out = dataclasses.asdict(self)
        del out["outcomes"]
        out["error_messages"] = out["error_messages"][:5]
        return out


def _image_urls(data: Any) -> list[str]:
    """The file URLs of the gallery (the first output): ``[{"image": FileData, "caption": ...}]``."""
    if not data or not isinstance(data[0], list):
        return []
    urls = []
    for item in data[0]:
        image = item.get("image") if isinstance(item, dict) else None
        if isinstance(image, dict) and image.get("url"):
            urls.append(str(image["url"]))
        elif isinstance(image, str):  # gradio_client with download_files: a local path
            urls.append(image)
    return urls


def _result(
    client: str, clients: int, outcomes: list[Outcome], seconds: float, cpu: float, setup_cpu: float, fetched: bool
) -> LoadResult:
    good = [o for o in outcomes if o.ok]
    bad = [o for o in outcomes if not o.ok]
    return LoadResult(
        client=client,
        clients=clients,
        count=len(good),
        errors=len(bad),
        seconds=seconds,
        images_per_second=sum(len(o.image_urls) for o in good) / seconds if seconds > 0 else 0.0,
        latency_ms=pct([o.latency_ms for o in good]) if good else {},
        client_cpu_seconds=cpu,
        client_cpu_ms_per_request=cpu / max(1, len(outcomes)) * 1000,
        setup_cpu_seconds=setup_cpu,
        fetched=fetched,
        error_messages=[str(o.error) for o in bad],
        outcomes=outcomes,
    )


# --- the asyncio driver ----------------------------------------------------------------------------


async def _endpoint(http: httpx.AsyncClient, url: str, api_name: str) -> tuple[int, int | None]:
    """(fn_index, trigger_id) of the named endpoint, from the app's config, as the JS client reads it."""
    config = (await http.get(url + "config")).json()
    for dep in config["dependencies"]:
        if dep.get("api_name") == api_name:
            targets = dep.get("targets") or [[None]]
            return int(dep["id"]), targets[0][0]
    raise LookupError(f"no endpoint named {api_name!r}")


async def _inputs(http: httpx.AsyncClient, url: str, api_name: str) -> int:
    """How many inputs the named endpoint takes: an older checkout (``bench.cpu --against``) takes
    fewer, the fields added since at the end of the table, at their defaults."""
    config = (await http.get(url + "config")).json()
    return next(len(dep.get("inputs") or ()) for dep in config["dependencies"] if dep.get("api_name") == api_name)


def _join_refusal(response: httpx.Response) -> str:
    """What a refused join says: a validator's failed parameters (422, as gradio_client reads them), or
    the body's start."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    if isinstance(detail, list):
        failed = [
            f"{d.get('parameter_name')}: {d.get('message')}"
            for d in detail
            if isinstance(d, dict) and d.get("__type__") == "validate" and d.get("is_valid") is False
        ]
        if failed:
            return "; ".join(failed)[:300]
    return response.text[:300]


async def sse_messages(response: httpx.Response) -> Any:
    """The ``data:`` messages of an event stream, framed on blank lines like gradio_client's reader."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            for line in frame.decode("utf-8").split("\n"):
                if line.startswith("data:"):
                    yield json.loads(line[5:])


def file_urls(value: Any) -> list[str]:
    """Every file URL in a message, in order: a gallery's FileData in a value, or a diff's replaced
    ``url`` (sse_v3 sends only what changed: ``["replace", [0, "image", "url"], "http://..."]``)."""
    if isinstance(value, str):
        return [value] if value.startswith("http") and "/file=" in value else []
    if isinstance(value, dict):
        return [u for v in value.values() for u in file_urls(v)]
    if isinstance(value, list):
        return [u for v in value for u in file_urls(v)]
    return []


async def async_request(
    http: httpx.AsyncClient,
    url: str,
    fn_index: int,
    trigger_id: int | None,
    session: str,
    data: list[Any],
    *,
    fetch: bool = False,
    keep_images: bool = False,
    previews: list[int] | None = None,
) -> Outcome:
    """One request through the queue: join, read the session's stream to this event's completion.

    ``previews`` (a list): fetch every file a progress message names as it comes, as the page's
    browser fetches each live preview, and append each one's size in bytes."""
    t0 = time.perf_counter()

    def done(ok: bool, error: str | None = None, **kw: Any) -> Outcome:
        return Outcome(ok, (time.perf_counter() - t0) * 1000, time.monotonic(), error, **kw)

    body = {"data": data, "event_data": None, "fn_index": fn_index, "trigger_id": trigger_id, "session_hash": session}
    try:
        joined = await http.post(url + "gradio_api/queue/join", json=body)
        if joined.status_code != 200:  # queue full (503), refused at join (422: a validator), bad body (400)
            return done(False, f"join {joined.status_code}: {_join_refusal(joined)}")
        event_id = joined.json()["event_id"]
        completed: dict[str, Any] | None = None
        async with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}) as stream:
            if stream.status_code != 200:
                return done(False, f"stream {stream.status_code}")
            async for message in sse_messages(stream):
                kind = message.get("msg")
                if kind == "process_completed" and message.get("event_id") == event_id:
                    completed = message  # read on to close_stream, as gradio_client does on sse_v3, so
                    # that the connection ends cleanly and goes back to the pool
                elif kind == "unexpected_error":
                    return done(False, f"unexpected_error: {message.get('message')}")
                elif kind == "close_stream":
                    break
                elif kind == "process_generating" and previews is not None and message.get("event_id") == event_id:
                    for preview_url in file_urls(message.get("output")):
                        if preview_url.endswith(".png"):
                            continue  # the final images (PNGs), also yielded through a progress message
                        got = await http.get(preview_url)
                        previews.append(len(got.content) if got.status_code == 200 else -1)
                # estimation, process_starts, progress, process_generating, log, heartbeat: read, passed over
        if completed is None:
            return done(False, "the stream closed without process_completed")
        output = completed.get("output") or {}
        if not completed.get("success"):
            return done(False, f"server error: {output.get('error')}")
        urls = _image_urls(output.get("data"))
        info = output["data"][1] if len(output.get("data") or []) > 1 else None
        if not urls:
            return done(False, "no image in the output", info=info)
        images = []
        if fetch:
            for image_url in urls:
                got = await http.get(image_url)
                if got.status_code != 200 or not got.content.startswith(PNG_SIGNATURE):
                    return done(False, f"image {got.status_code}: not a PNG", image_urls=urls, info=info)
                if keep_images:
                    images.append(got.content)
        return done(True, image_urls=urls, info=info, images=images)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return done(False, repr(exc)[:300])


class Window:
    """When a closed loop stops sending: after ``n`` requests, or ``seconds``, whichever comes first;
    with ``min_seconds``, not before that many seconds even past ``n`` (a steady window on a fast
    device, where ``n`` requests take well under a second and a round's start and end would weigh)."""

    def __init__(self, n: int | None, seconds: float | None, min_seconds: float | None) -> None:
        now = time.monotonic()
        self.n = n
        self.deadline = None if seconds is None else now + seconds
        self.floor = None if min_seconds is None else now + min_seconds

    def more(self, k: int) -> bool:
        """Whether the k-th request (from 0) is sent."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            return False
        return self.n is None or k < self.n or (self.floor is not None and now < self.floor)


async def run_async(
    url: str,
    clients: int,
    *,
    n: int | None = None,
    seconds: float | None = None,
    min_seconds: float | None = None,
    size: int = 512,
    steps: int = 1,
    fetch: bool = False,
    keep_images: bool = False,
    api_name: str = "generate",
    data: Callable[[int], list[Any]] | None = None,
    timeout: float = 120.0,
    on_start: Callable[[], None] | None = None,
) -> LoadResult:
    """``clients`` virtual callers in this event loop; see ``run``."""
    cpu0 = time.process_time()
    limits = httpx.Limits(max_connections=2 * clients + 4, max_keepalive_connections=2 * clients + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        fn_index, trigger_id = await _endpoint(http, url, api_name)
        width = await _inputs(http, url, api_name)
        make = data or (lambda k: generate_data(k, size, steps)[:width])
        setup_cpu = time.process_time() - cpu0
        if on_start is not None:
            on_start()
        counter = itertools.count()
        outcomes: list[Outcome] = []
        t0, cpu1 = time.perf_counter(), time.process_time()
        window = Window(n, seconds, min_seconds)

        async def caller() -> None:
            session = uuid.uuid4().hex[:11]
            while window.more(k := next(counter)):
                outcomes.append(
                    await async_request(
                        http, url, fn_index, trigger_id, session, make(k), fetch=fetch, keep_images=keep_images
                    )
                )

        await asyncio.gather(*(caller() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu1
    return _result("async", clients, outcomes, elapsed, cpu, setup_cpu, fetch)


# --- the gradio_client driver ----------------------------------------------------------------------


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


# --- either driver ---------------------------------------------------------------------------------


def run(url: str, clients: int, *, client: str = "async", **kwargs: Any) -> LoadResult:
    """Drive ``url``'s ``/generate`` with ``clients`` closed-loop callers until ``n`` requests have
    been sent or ``seconds`` have passed (either or both; neither would run forever); with
    ``min_seconds``, for at least that long (``Window``).

    ``client``: ``async`` (one asyncio loop) or ``gradio`` (gradio_client threads). Keyword arguments:
    ``n``, ``seconds``, ``size``, ``steps``, ``fetch`` (download each image), ``data(k)`` (the k-th
    request's inputs, default ``generate_data``), ``on_start()`` (called as the timed window opens,
    after the clients are built); ``keep_images`` (async only: keep the fetched bytes).
    """
    if kwargs.get("n") is None and kwargs.get("seconds") is None:
        raise ValueError("give n or seconds")
    if client == "async":
        return asyncio.run(run_async(url, clients, **kwargs))
    if client == "gradio":
        kwargs.pop("keep_images", None)
        return run_gradio(url, clients, **kwargs)
    raise ValueError(f"client must be one of {CLIENTS}, not {client!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--client", choices=CLIENTS, default="async")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--fetch", action="store_true", help="download every image, as gradio_client does by default")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    url = args.url if args.url.endswith("/") else args.url + "/"
    result = run(
        url,
        args.clients,
        client=args.client,
        n=args.n,
        seconds=args.seconds if args.n or args.seconds else 5.0,
        size=args.size,
        steps=args.steps,
        fetch=args.fetch,
    )
    summary = result.summary()
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0 if result.errors == 0 and result.count > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

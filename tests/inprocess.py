"""The engine in process, called the way ``gradio_client`` calls the launched app: ``predict`` and ``submit``.

The family matrices check the engine (defaults, refusals, pixels, progress, cancel, batching), which
does not need a server between the test and ``LocalAdapter.run``: launching one per family cost
most of the suite's time. ``Engine`` is the app's own backend (``app.start_backend``, the model on
its named thread) driven from an event loop of its own, on a thread, with the raw request the
handler builds (uploads as bytes, as ``handler.with_upload_bytes`` reads them). A call's outputs
are what the API's are: ``(gallery, record)``, the gallery ``[{"image": path}]``, the record's
``status`` waiting, running or done (the done record is the info record). A refusal raises the
engine's ``InvalidRequest``, whose text is what gradio_client's ``ValidationError`` carries.

    with engine_for(tmp, "--model", folder) as (client, adapter):
        gallery, info = client.predict(**raw_request(), api_name="/generate")

Each matrix keeps one family per build group launched (``served``): the same tests through the
real server and ``gradio_client``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import InvalidRequest
from pipeline.serving.local import LocalAdapter

Outputs = tuple[list[dict[str, Any]] | None, dict[str, Any]]


class EngineJob:
    """One submitted request, as ``gradio_client.Job``: ``outputs()``, ``done()``, ``cancel()``, ``result()``."""

    def __init__(self, engine: Engine, raw: dict[str, Any]) -> None:
        self._adapter = engine.adapter
        self._outputs: list[Outputs] = []
        self._future = asyncio.run_coroutine_threadsafe(self._run(raw), engine.loop)

    async def _run(self, raw: dict[str, Any]) -> Outputs:
        events = self._adapter.run(raw)
        async with contextlib.aclosing(events):  # a cancel closes it, as Gradio's cancel closes the handler
            async for event in events:
                out: Outputs
                if event.kind == "waiting":
                    out = (None, {"status": "waiting", "ahead": event.ahead})
                elif event.kind == "step":
                    shown = [{"image": event.preview}] if event.preview is not None else None
                    out = (shown, {"status": "running", "step": event.step, "total": event.total})
                else:
                    out = ([{"image": str(path)} for path in event.paths], {"status": "done", **event.info})
                self._outputs.append(out)
        return self._outputs[-1]

    def outputs(self) -> list[Outputs]:
        return list(self._outputs)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        return self._future.cancel()

    def result(self, timeout: float | None = None) -> Outputs:
        return self._future.result(timeout)


class Engine:
    """``LocalAdapter.run`` on a loop thread of its own, with gradio_client's ``predict`` and ``submit``."""

    def __init__(self, adapter: LocalAdapter) -> None:
        self.adapter = adapter
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-client-loop", daemon=True)
        self._thread.start()

    def submit(self, *, api_name: str = "/generate", **raw: Any) -> EngineJob:
        assert api_name == "/generate", api_name
        return EngineJob(self, {name: upload(value) for name, value in raw.items()})

    def predict(self, *, api_name: str = "/generate", **raw: Any) -> Outputs:
        try:
            return self.submit(api_name=api_name, **raw).result(timeout=600)
        except concurrent.futures.CancelledError:
            raise AssertionError("the request was cancelled") from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class File:
    """A file to send, as ``gradio_client.handle_file`` names one: the engine reads its bytes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)


def upload(value: Any) -> Any:
    return value.path.read_bytes() if isinstance(value, File) else value


def handle_file(client: Any, path: str | Path) -> Any:
    """The upload the client sends: gradio_client's ``handle_file`` for a launched app, bytes in process."""
    if isinstance(client, Engine):
        return File(path)
    from gradio_client import handle_file as gradio_handle_file

    return gradio_handle_file(str(path))


def refused() -> tuple[type[Exception], ...]:
    """What a field-named refusal raises: the engine's ``InvalidRequest``, or gradio_client's ``ValidationError``."""
    from gradio_client.exceptions import ValidationError

    return (InvalidRequest, ValidationError)


@contextlib.contextmanager
def engine_for(tmp: Path, *args: str) -> Iterator[tuple[Engine, LocalAdapter]]:
    """The app's backend for these flags (``--model-side thread``), without a server, and its client."""
    import app
    from pipeline.config import load_settings

    settings = load_settings(["--model-side", "thread", "--output-dir", str(tmp / "outputs"), *args], environ={})
    adapter = app.start_backend(settings)
    assert isinstance(adapter, LocalAdapter)
    engine = Engine(adapter)
    try:
        yield engine, adapter
    finally:  # as a launched app closes: the model and the adapter first, while the loop still runs
        adapter.shutdown_model(timeout=10)
        adapter.close()
        engine.close()


@contextlib.contextmanager
def served_family(tmp: Path, folder: Path, launched: bool, *args: str) -> Iterator[tuple[Any, LocalAdapter]]:
    """A family's model behind the launched app and ``gradio_client`` (``launched``), or in process."""
    flags = ("--model", str(folder), "--model-side", "thread", *args)
    if not launched:
        with engine_for(tmp, *flags) as (engine, adapter):
            yield engine, adapter
        return
    from gradio_client import Client

    from tests.helpers import running_app

    with running_app(tmp, *flags) as (url, _demo, adapter):
        yield Client(url, verbose=False, download_files=str(tmp / "dl")), adapter


def step_cache_row(client: Any, adapter: LocalAdapter, request: dict[str, Any], fewest_steps: int) -> str:
    """Issue 50 through the app, a family matrix's "step cache" row: ``request`` with ``step_cache="auto"``
    sent while a long uncached request runs (beside one with "reuse") joins that loop mid-way where the
    family has one, and equals itself sent alone, taylorseer's steps skipped; a family without a loop runs it off (one call at its
    ``fewest_steps``). Asserts both; returns the row's text."""
    if not adapter.profile.step_caches:
        _, info = client.predict(**{**request, "num_inference_steps": fewest_steps, "step_cache": "auto"},
                                 api_name="/generate")  # fmt: skip
        assert info["step_cache"]["method"] == "off", info
        return "off (no step-level loop)"
    seen = cached_joined_and_alone(client, adapter, request)
    joined, alone = seen["joined"], seen["alone"]
    assert joined["step_cache"] == alone["step_cache"] and alone["step_cache"]["method"] == "taylorseer", seen
    assert alone["step_cache"]["skipped"] > 0 and joined["joined_at_step"] >= 1, seen
    assert seen["difference"] <= 1.0, seen
    skipped, steps = alone["step_cache"]["skipped"], request["num_inference_steps"]
    return f"auto: {skipped} of {steps} skipped, joined {seen['difference']:.2f}/255 from alone"


def cached_joined_and_alone(client: Any, adapter: LocalAdapter, request: dict[str, Any]) -> dict[str, Any]:
    """Issue 50 through the app: ``request`` with ``step_cache="auto"`` sent while a long uncached request
    runs, beside one with ``"reuse"`` (they join that loop where the family has one), then alone. Returns both records and the two
    pictures' mean difference (1/255 units), and whether the cached one joined mid-way."""
    import time

    import numpy as np
    from PIL import Image

    def picture(gallery: Any) -> Any:
        with Image.open(gallery[0]["image"]) as png:
            return np.asarray(png.convert("RGB"), dtype=np.float32)

    p = adapter.profile
    long_steps = p.max_steps if not p.step_choices else request["num_inference_steps"]
    long = client.submit(**{**request, "seed": 3, "num_inference_steps": long_steps, "step_cache": "off"},
                         api_name="/generate")  # fmt: skip

    def steps() -> float:  # the denoising steps run so far (prometheus' denoise_steps_total)
        return sum(s.value for metric in adapter.metrics.denoise_steps.collect() for s in metric.samples
                   if s.name.endswith("_total"))  # fmt: skip

    base, deadline = steps(), time.monotonic() + 60
    while steps() < base + 1 and time.monotonic() < deadline:  # the long request's first step ran
        time.sleep(0.002)
    other = client.submit(**{**request, "seed": 4, "step_cache": "reuse"}, api_name="/generate")  # another method
    joined, joined_info = client.predict(**{**request, "step_cache": "auto"}, api_name="/generate")
    long.result(timeout=600)
    assert other.result(timeout=600)[1]["step_cache"]["method"] == "reuse"
    alone, alone_info = client.predict(**{**request, "step_cache": "auto"}, api_name="/generate")
    difference = float(np.abs(picture(joined) - picture(alone)).mean())
    return {"joined": joined_info, "alone": alone_info, "difference": difference}

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pipeline.adapter import LocalAdapter
from pipeline.request import Limits
from pipeline.worker import GpuWorker
from tests.fakes import FakeModel


@pytest.fixture(autouse=True, scope="session")
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Gradio's cache and the app's output folder live in this run's tmp dir, never in /tmp/gradio.

    Session-wide, because a launched server serves files only from the cache folder it started
    with: a per-test folder would make a module-scoped server's files unreachable.
    """
    tmp = tmp_path_factory.mktemp("isolated")
    saved = dict(os.environ)
    os.environ.update(
        GRADIO_TEMP_DIR=str(tmp / "gradio"),
        T2I_OUTPUT_DIR=str(tmp / "outputs"),
        GRADIO_ANALYTICS_ENABLED="False",
        HF_HUB_OFFLINE="1",
    )
    yield
    os.environ.clear()
    os.environ.update(saved)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raw_request(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "prompt": "a red circle",
        "negative_prompt": "",
        "seed": 1,
        "randomize_seed": False,
        "width": 64,
        "height": 64,
        "num_inference_steps": 4,
        "guidance_scale": 7.5,
        "num_images": 1,
    }
    raw.update(overrides)
    return raw


@pytest.fixture
def make_adapter(tmp_path: Path) -> Any:
    """Build a LocalAdapter around a FakeModel on a real GpuWorker thread; cleaned up afterwards."""
    made: list[tuple[GpuWorker, LocalAdapter]] = []

    def make(model: FakeModel | None = None, **kwargs: Any) -> tuple[LocalAdapter, FakeModel]:
        model = model or FakeModel()
        worker = GpuWorker(lambda: model)
        profile = worker.start(timeout=10)
        adapter = LocalAdapter(worker, Limits.for_model(profile), tmp_path / "outputs", **kwargs)
        made.append((worker, adapter))
        return adapter, model

    yield make
    for worker, adapter in made:
        worker.shutdown(timeout=10)
        adapter.close()


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll a condition the code under test reaches on its own (no sleep decides the order)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.002)


async def collect(adapter: LocalAdapter, raw: dict[str, Any], **kwargs: Any) -> list[Any]:
    return [event async for event in adapter.run(raw, **kwargs)]


@contextlib.contextmanager
def running_app(tmp: Path, *args: str, load: Callable[[], Any] | None = None) -> Iterator[tuple[str, Any, LocalAdapter]]:
    """The real app launched on a free port (real model unless ``load`` injects one); closed after."""
    import app
    from pipeline.config import load_settings

    port = free_port()
    settings = load_settings(["--port", str(port), "--output-dir", str(tmp / "outputs"), *args], environ={})
    demo, adapter = app.create_app(settings, load=load)
    app.launch(demo, adapter, settings)
    try:
        yield f"http://127.0.0.1:{port}/", demo, adapter
    finally:
        demo.close()
        adapter.worker.shutdown(timeout=10)
        adapter.close()


def queue_call(url: str, fn_index: int, data: list[Any], timeout: float = 60.0) -> dict[str, Any]:
    """One request through Gradio's queue over raw HTTP; see ``bench.probe.raw_http_predict``."""
    from bench.probe import raw_http_predict

    return raw_http_predict(url, fn_index, data, timeout)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.005) -> None:
    """Poll, from a test thread, a condition the code under test reaches on its own."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(every)


def api_fn_index(url: str, api_name: str = "generate") -> int:
    import httpx

    config = httpx.get(url + "config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)

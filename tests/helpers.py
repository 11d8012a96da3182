"""Helpers shared by the tests: requests, waits, launched apps. Fixtures live in ``conftest.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.fields import TABLE_FIELDS
from pipeline.request import FIELDS, PICTURE_DEFAULTS
from pipeline.serving.local import LocalAdapter

ROOT = Path(__file__).resolve().parent.parent


class LongModuleWarning(UserWarning):
    """A module longer than most concepts take (``tests/unit/test_layout.py``): shown in the warnings
    summary, never an error (``pyproject.toml`` lets this category through)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The picture fields and the table fields of a text-to-image request, as the page and gradio_client
# send their defaults.
_TEXT = {**PICTURE_DEFAULTS, **{f.name: f.default for f in TABLE_FIELDS}, "control_image": None}
TEXT_MODE: dict[str, Any] = {name: _TEXT[name] for name in FIELDS if name in _TEXT}  # in the API's order


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
        "scheduler": "default",
        "lora": "none",
        "lora_scale": 1.0,
        **TEXT_MODE,
    }
    raw.update(overrides)
    return raw


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
def running_app(
    tmp: Path, *args: str, load: Callable[[], Any] | None = None
) -> Iterator[tuple[str, Any, LocalAdapter]]:
    """The real app launched on a free port (real model unless ``load`` injects one); closed after.

    An injected fake's default job is 64 px and 4 steps, so the default cost budget (8 of them)
    would refuse the long jobs ordering tests need: with ``load``, ``--max-pixel-steps`` is 50
    steps of 4 images at 512 px unless the test names its own.
    """
    import app
    from pipeline.config import load_settings

    if load is not None and "--max-pixel-steps" not in args:
        args = (*args, "--max-pixel-steps", str(512 * 512 * 50 * 4))
    port = free_port()
    settings = load_settings(["--port", str(port), "--output-dir", str(tmp / "outputs"), *args], environ={})
    demo, adapter = app.create_app(settings, load=load)
    app.launch(demo, adapter, settings)
    try:
        yield f"http://127.0.0.1:{port}/", demo, adapter
    finally:
        demo.close()
        adapter.shutdown_model(timeout=10)
        adapter.close()


def queue_call(url: str, fn_index: int, data: list[Any], timeout: float = 60.0) -> dict[str, Any]:
    """One request through Gradio's queue over raw HTTP; see ``bench.probe.raw_http_predict``.

    One session per test thread, as a real client keeps one: the app caps the sessions one
    address may open (``--max-sessions-per-user``), and a fuzz of hundreds of calls is one client.
    """
    import threading

    from bench.probe import raw_http_predict

    return raw_http_predict(url, fn_index, data, timeout, session=f"tests{threading.get_ident()}")


def wait_for(
    predicate: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.005, about: Any = None
) -> None:
    """Poll, from a test thread, a condition the code under test reaches on its own (``about``: what to
    show beside the timeout, such as the last state read)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}" + (f": {about()}" if about else "")
        time.sleep(every)


def api_fn_index(url: str, api_name: str = "generate") -> int:
    from bench.probe import api_fn_index as index

    return index(url, api_name)


@contextlib.contextmanager
def app_process(
    tmp: Path, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 120.0
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``python app.py`` in a subprocess on a free port, as a user starts it; killed afterwards.

    Yields (url, process, log path) once ``/health`` answers ok; the log is in the assertion on failure.
    """
    import httpx

    port = free_port()
    log_path = tmp / f"server-{port}.log"
    full_env = {
        **os.environ,
        "GRADIO_TEMP_DIR": str(tmp / "gradio"),
        "T2I_OUTPUT_DIR": str(tmp / "out"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    url = f"http://127.0.0.1:{port}/"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(port), *args],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + ready_timeout
            while True:
                assert proc.poll() is None, f"the app exited ({proc.returncode}):\n{log_path.read_text()[-4000:]}"
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "health", timeout=2).json()["status"] == "ok":
                        break
                assert time.monotonic() < deadline, f"the app never became ready:\n{log_path.read_text()[-4000:]}"
                time.sleep(0.1)
            yield url, proc, log_path
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextlib.contextmanager
def gate_held(adapter: LocalAdapter) -> Iterator[None]:
    """Hold a launched app's GPU gate from the test, so requests line up behind it; on leaving,
    release it and wake the line (as a job leaving the gate does). The gate is free on entry, and the
    app has served a request (so the adapter knows the event loop that owns the gate)."""
    gate = adapter._gate
    assert adapter._loop is not None, "the adapter learns its event loop from a request: serve one first"
    assert not gate.locked(), "the gate was busy"
    adapter.on_loop(lambda: asyncio.ensure_future(gate.acquire()) and None)
    wait_for(gate.locked, "the test holds the gate", timeout=10)
    try:
        yield
    finally:

        def release() -> None:
            gate.release()
            adapter._line.notify()

        adapter.on_loop(release)


def assert_progress(steps: list[Any], total: int) -> None:
    """A request's steps as its consumer read them (``Step`` or ``StepEvent``-like): in order, each of
    ``total``, the last one always; steps a consumer that was behind had not read are coalesced
    (``line.Mailbox``), so a fast model's steps may arrive as fewer."""
    numbers = [s.step for s in steps]
    assert numbers and numbers == sorted(set(numbers)) and numbers[0] >= 1, numbers
    assert numbers[-1] == total and all(s.total == total for s in steps), [(s.step, s.total) for s in steps]


def process_exited(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


# The stand-in packages (``spaces``) that a test puts first on the path.
SPACES_STUBS = ROOT / "tests" / "stubs"


def spaces_calls(log: Path) -> list[dict[str, Any]]:
    """The stand-in ``spaces``' record of its GPU calls (``SPACES_STUB_LOG``), one dict a call."""
    import json

    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_loop(model: Any, first: Any, joiner: Any = None, join_at: int = 1) -> dict[str, Any]:
    """``first`` through a step-level loop of ``model`` (``joining.LoopDriver``), ``joiner`` entering
    once the first has run ``join_at`` steps; each job's terminal event by request id."""
    from pipeline.engine.hosting.runner import NEVER
    from pipeline.engine.loop.joining import LoopDriver
    from pipeline.protocol import Submission

    ended: dict[str, Any] = {}

    def Task(job: Any) -> Submission:
        return Submission(job, NEVER, lambda event: ended.__setitem__(job.request_id, event))

    pending = [Task(joiner)] if joiner is not None else []
    loop = model.open_loop(first)
    LoopDriver(loop, lambda: pending.pop() if pending and loop.steps_done(0) >= join_at else None).run(Task(first))
    return ended


# One call of the MCP tool ``generate`` (the app under ``--mcp``): small, quick arguments.
MCP_TOOL_ARGS = {
    "prompt": "a red circle",
    "negative_prompt": "",
    "seed": 1,
    "randomize_seed": False,
    "width": 64,
    "height": 64,
    "num_inference_steps": 2,
    "guidance_scale": 4.0,
    "num_images": 1,
    "live_preview": False,
}


async def mcp_session(url: str, work: Callable[[Any], Any], http: Any = None) -> Any:
    """``await work(session)`` in an initialised MCP session with the app's MCP server (streamable
    HTTP; through ``http``, an ``httpx.AsyncClient``, when given: its address or headers)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with contextlib.AsyncExitStack() as stack:
        if http is not None:
            await stack.enter_async_context(http)
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(url + "gradio_api/mcp/", **({"http_client": http} if http is not None else {}))
        )
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return await work(session)


@contextlib.contextmanager
def ray_backend(tmp: Path, **settings: Any) -> Iterator[Any]:
    """The Ray backend on this machine: two CPU replicas of one core and one torch thread each, batches of two
    (``settings`` add to or override these), behind a ``RayAdapter``; closed after."""
    from pipeline.config import Settings
    from pipeline.ray import cluster
    from pipeline.ray.adapter import RayAdapter

    base: dict[str, Any] = dict(backend="ray", replicas=2, torch_threads=1, replica_cpus=1, max_batch_size=2,
                                output_dir=tmp / "out", sweep_interval=3600)  # fmt: skip
    chosen = Settings(**{**base, **settings})
    adapter = RayAdapter(cluster.start(chosen), chosen)
    try:
        yield adapter
    finally:
        adapter.close()
        adapter.shutdown_model()

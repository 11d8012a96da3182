"""The ``spaces`` stand-in in ``tests/stubs`` (mirrors spaces 0.51.0's ``@spaces.GPU``) against itself: a
forked worker per call, arguments pickled in the caller, yields streamed back, stop on close, errors surfaced.

Every call that could block runs in a helper thread read with a 30 s timeout, so a broken stand-in fails
a test instead of hanging it.
"""

from __future__ import annotations

import contextvars
import json
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import gradio as gr
import pytest
from gradio.context import LocalContext

from tests.helpers import SPACES_STUBS

STUBS = SPACES_STUBS
TIMEOUT = 30.0


def _drop_spaces() -> None:
    for name in [n for n in sys.modules if n == "spaces" or n.startswith("spaces.")]:
        del sys.modules[name]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "spaces_calls.jsonl"


@pytest.fixture
def load_spaces(monkeypatch: pytest.MonkeyPatch, log: Path) -> Iterator[Callable[[str | None], ModuleType]]:
    """``load_spaces(value)`` imports the stand-in afresh with ``SPACES_ZERO_GPU=value`` (unset for None)."""
    monkeypatch.syspath_prepend(str(STUBS))
    monkeypatch.setenv("SPACES_STUB_LOG", str(log))

    def load(zero_gpu: str | None) -> ModuleType:
        _drop_spaces()
        if zero_gpu is None:
            monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
        else:
            monkeypatch.setenv("SPACES_ZERO_GPU", zero_gpu)
        import spaces

        assert Path(spaces.__file__).parent == STUBS / "spaces"
        return spaces

    _drop_spaces()
    yield load
    _drop_spaces()


@pytest.fixture
def spaces(load_spaces: Callable[[str | None], ModuleType]) -> ModuleType:
    return load_spaces("true")


def bounded(fn: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """``fn()`` in a daemon thread; its result or its exception, or a failure after ``timeout`` seconds."""
    box: queue.Queue[tuple[bool, Any]] = queue.Queue()

    def run() -> None:
        try:
            box.put((True, fn()))
        except BaseException as e:
            box.put((False, e))

    threading.Thread(target=run, daemon=True).start()
    try:
        ok, value = box.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no answer within {timeout} s")
    if not ok:
        raise value
    return value


def take(gen: Iterator[Any], n: int | None = None) -> list[Any]:
    """The first ``n`` items (all if None), then ``close()`` the generator."""
    out: list[Any] = []
    try:
        for item in gen:
            out.append(item)
            if n is not None and len(out) == n:
                break
    finally:
        gen.close()
    return out


# --- functions that run in the worker (module level: the worker is forked, only arguments are pickled) ----
def count_up(n: int, tag: str) -> Iterator[tuple[int, int, str]]:
    for i in range(n):
        yield i, os.getpid(), tag


def slow_count(n: int, marker: str) -> Iterator[int]:
    i = 0
    try:
        for i in range(n):
            yield i
            time.sleep(0.01)
    except GeneratorExit:
        Path(marker).write_text(f"closed after {i + 1}")
        raise
    Path(marker).write_text("ran to the end")


def fails_after_one(exc: Exception) -> Iterator[int]:
    yield 1
    raise exc


def dies() -> Iterator[int]:
    yield 1
    os._exit(3)


def takes_anything(x: Any) -> Iterator[Any]:
    yield repr(x)


def child_pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


async def a_coroutine() -> None:
    return None


def records(spaces: ModuleType, log: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == spaces.calls
    return lines


# --- tests -------------------------------------------------------------------------------------------------
def test_a_generator_streams_its_yields_back_from_a_forked_child(spaces: ModuleType, log: Path) -> None:
    wrapped = spaces.GPU(duration=lambda n, tag: 2 * n, size="xlarge")(count_up)
    assert wrapped is not count_up and wrapped.__name__ == "count_up" and hasattr(wrapped, "zerogpu")
    items = bounded(lambda: take(wrapped(3, tag="x")))
    assert [(i, tag) for i, _, tag in items] == [(0, "x"), (1, "x"), (2, "x")]
    pids = {pid for _, pid, _ in items}
    assert len(pids) == 1 and os.getpid() not in pids
    [rec] = records(spaces, log)
    assert rec == {
        "function": "count_up",
        "size": "xlarge",
        "duration": 6,
        "saw_request": False,
        "session_hash": None,
        "pid_parent": os.getpid(),
        "pid_child": pids.pop(),
        "yields": 3,
        "stopped": False,
        "error": None,
    }


@pytest.mark.parametrize(
    "make", [threading.Lock, threading.Event, lambda: lambda: None], ids=["lock", "event", "closure"]
)
def test_an_unpicklable_argument_fails_in_the_caller(spaces: ModuleType, log: Path, make: Callable[[], Any]) -> None:
    wrapped = spaces.GPU(duration=10)(takes_anything)
    gen = wrapped(make())  # a generator function: nothing happens until the first next()
    assert spaces.calls == []
    with pytest.raises(pickle.PicklingError) as info:
        bounded(lambda: next(gen))
    if make is not threading.Lock and make is not threading.Event:
        assert "Can't pickle local object" in str(info.value)
    else:  # what the app hit at warm-up, a threading.Event / on_step closure among the arguments
        assert str(info.value) == "cannot pickle '_thread.lock' object"
        assert isinstance(info.value.__context__, TypeError)
    [rec] = records(spaces, log)
    assert rec["error"] == "PicklingError" and rec["yields"] == 0 and rec["pid_child"] != os.getpid()


def test_closing_the_consumer_stops_the_child_early(spaces: ModuleType, log: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    wrapped = spaces.GPU(slow_count)
    assert bounded(lambda: take(wrapped(500, str(marker)), 3)) == [0, 1, 2]
    # close() returned only after the child's end marker: the child's generator was closed already
    assert marker.read_text().startswith("closed after")
    [rec] = records(spaces, log)
    assert rec["stopped"] is True and rec["error"] is None and 3 <= rec["yields"] < 100
    assert rec["duration"] == 60  # no duration: the real default


def test_a_worker_exception_surfaces_in_the_caller(spaces: ModuleType, log: Path) -> None:
    wrapped = spaces.GPU(duration=5)(fails_after_one)
    got: list[int] = []
    with pytest.raises(gr.Error) as info:
        bounded(lambda: got.extend(wrapped(ValueError("boom"))))
    assert got == [1] and info.value.message == "ValueError" and info.value.title == "ZeroGPU worker error"
    with pytest.raises(gr.Error) as info:  # a gr.Error raised by the function comes back as itself
        bounded(lambda: list(wrapped(gr.Error("shown to the user"))))
    assert info.value.message == "shown to the user"
    assert [(r["error"], r["yields"]) for r in records(spaces, log)] == [("ValueError", 1), ("Error", 1)]


def test_a_worker_that_dies_aborts_the_call(spaces: ModuleType, log: Path) -> None:
    with pytest.raises(gr.Error, match="GPU task aborted"):
        bounded(lambda: list(spaces.GPU(dies)()))
    assert records(spaces, log)[0]["error"] == "AbortedResult"


def test_the_request_is_read_from_gradios_context_var_in_the_caller(spaces: ModuleType, log: Path) -> None:
    wrapped = spaces.GPU(duration=5)(count_up)
    ctx = contextvars.copy_context()
    ctx.run(LocalContext.request.set, SimpleNamespace(session_hash="abc123"))
    bounded(lambda: ctx.run(take, wrapped(1, "in")))
    bounded(lambda: take(wrapped(1, "out")))
    assert [(r["saw_request"], r["session_hash"]) for r in records(spaces, log)] == [(True, "abc123"), (False, None)]


def test_a_regular_function_crosses_the_same_boundary(spaces: ModuleType, log: Path) -> None:
    wrapped = spaces.GPU(duration=5)(child_pid)
    value, pid = bounded(lambda: wrapped(7))
    assert value == 7 and pid != os.getpid()
    with pytest.raises(pickle.PicklingError, match="cannot pickle '_thread.lock' object"):
        bounded(lambda: wrapped(threading.Lock()))
    assert [(r["pid_child"], r["yields"], r["error"]) for r in records(spaces, log)] == [
        (pid, 0, None),
        (spaces.calls[1]["pid_child"], 0, "PicklingError"),
    ]


def test_the_decorator_forms_and_its_cache(spaces: ModuleType) -> None:
    wrapped = spaces.GPU(count_up)
    assert spaces.GPU(count_up) is wrapped and spaces.GPU(duration=9)(wrapped) is wrapped
    assert spaces.decorated_cache[count_up] is wrapped
    with pytest.raises(NotImplementedError):
        spaces.GPU(a_coroutine)


@pytest.mark.parametrize(
    "value,on",
    [
        ("1", True),
        ("t", True),
        ("TRUE", True),
        ("True", True),
        ("0", False),
        ("yes", False),
        ("", False),
        (None, False),
    ],
)
def test_off_zero_gpu_the_function_comes_back_unchanged(
    load_spaces: Callable[[str | None], ModuleType], value: str | None, on: bool
) -> None:
    spaces = load_spaces(value)
    assert spaces.config.Config.zero_gpu is on
    if not on:
        assert spaces.GPU(count_up) is count_up and spaces.GPU(duration=5, size="xlarge")(count_up) is count_up
        assert "spaces.wrappers" not in sys.modules

"""Fixtures, defined once here, and the tiers. Helpers (requests, waits, launched apps) are in ``tests/helpers.py``.

A test's tier is its folder, and the folder gives its marks (no module marks itself ``server`` or
``browser``; ``tests/unit/test_layout.py`` checks):

- ``tests/unit/``: no server, no browser; the fast tier (``python -m pytest tests/unit``, the same as
  ``-m "not server and not slow"``);
- ``tests/server/``: a launched app, a subprocess, Ray or a benchmark run (marked ``server``);
- ``tests/browser/``: Debian's chromium through Playwright on a launched app (marked ``server`` and
  ``browser``; skipped where chromium is not installed, which ``.ci/run`` installs).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pipeline.engine.hosting.runner import ModelRunner
from pipeline.request import Limits
from pipeline.serving.local import LocalAdapter
from tests.fakes import FakeModel

TESTS = Path(__file__).resolve().parent
TIERS: dict[str, tuple[str, ...]] = {"unit": (), "server": ("server",), "browser": ("server", "browser")}


def _threads_per_worker() -> None:
    """Under pytest-xdist, each worker's torch takes its share of the cores (not every core each: two
    workers with two threads each on two cores ran every tensor op at half speed and then waited on
    each other). The apps a test launches in a subprocess choose their own threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_threads_per_worker()


def tier_of(path: Path) -> str:
    """The tier of a test module: the folder under ``tests/`` it lives in."""
    return path.resolve().relative_to(TESTS).parts[0]


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test gets its folder's marks before ``-m`` selects (``pytest_collection_modifyitems``)."""
    tier = tier_of(item.path)
    if tier not in TIERS:
        raise pytest.UsageError(f"{item.nodeid}: a test module lives in one of tests/{{{','.join(TIERS)}}}/")
    for mark in TIERS[tier]:
        item.add_marker(mark)
    if tier == "unit" and "launch" in getattr(item, "fixturenames", ()):
        raise pytest.UsageError(f"{item.nodeid}: a unit test launches no app; move it to tests/server/")
    if tier == "browser":
        from tests.pages import CHROMIUM

        if not Path(CHROMIUM).exists():
            item.add_marker(pytest.mark.skip(reason="Debian's chromium is not installed (.ci/run installs it)"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules longest first (``tests/durations.json``, written by ``python -m tools.slowest``).

    pytest-xdist (``--dist loadfile``, ``pyproject.toml``) hands a worker a whole module at a time in
    collection order; a long module handed out last runs alone while the other worker idles. Longest
    first, the many short modules fill the end. A module the file does not know goes last; within a
    module the order is pytest's own (its module-scoped apps start once).
    """
    known: dict[str, float] = json.loads((TESTS / "durations.json").read_text())

    def module(item: pytest.Item) -> str:
        return item.path.resolve().relative_to(TESTS.parent).as_posix()

    place = {name: i for i, name in enumerate(dict.fromkeys(module(item) for item in items))}
    items.sort(key=lambda item: (-known.get(module(item), 0.0), place[module(item)]))


@pytest.fixture(autouse=True, scope="session")
def _patient_gradio_client() -> Iterator[None]:
    """gradio_client waits for a loaded machine: httpx's default timeouts are 5 s, and on 2 cores shared
    by two pytest-xdist workers a launched app's config fetch once took longer (a ``ReadTimeout`` in
    ``Client(url)``). Connecting, writing and the pool wait up to 60 s; reads as long as they take
    (the event stream's own default; a hung server still meets pytest-timeout). A test's own
    ``httpx_kwargs`` win."""
    import httpx
    from gradio_client import Client

    original = Client.__init__
    patient = httpx.Timeout(60.0, read=None)

    def init(self: Any, *args: Any, httpx_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        original(self, *args, httpx_kwargs={"timeout": patient, **(httpx_kwargs or {})}, **kwargs)

    Client.__init__ = init
    yield
    Client.__init__ = original


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


@pytest.fixture(scope="module")
def fake() -> FakeModel:
    """The module's fake model (one per module: a module's launched app and its tests share it)."""
    return FakeModel()


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[str, Any, LocalAdapter]]]:
    """Start the real app (``helpers.running_app``) for this module: ``launch(*flags, load=None)`` returns
    (url, demo, adapter); every app it started is closed when the module's tests are done."""
    with contextlib.ExitStack() as stack:

        def start(
            *args: str, load: Callable[[], Any] | None = None, name: str = "app"
        ) -> tuple[str, Any, LocalAdapter]:
            from tests.helpers import running_app

            return stack.enter_context(running_app(tmp_path_factory.mktemp(name), *args, load=load))

        yield start


@pytest.fixture(scope="module")
def client(url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A ``gradio_client.Client`` on the module's ``url`` fixture (its files in the run's tmp dir)."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=str(tmp_path_factory.mktemp("client-files")))


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``@pytest.mark.anyio``) run on asyncio, the event loop Gradio serves on."""
    return "asyncio"


@pytest.fixture
def make_adapter(tmp_path: Path) -> Any:
    """Build a LocalAdapter around a FakeModel on a real ModelRunner thread; cleaned up afterwards.

    The fake's default job is 64 px and 4 steps, so the default cost budget (8 of them) would refuse
    the long jobs the ordering tests need: ``max_pixel_steps`` is 50 steps of 4 images at 512 px
    unless a test names its own.
    """
    made: list[LocalAdapter] = []

    def make(
        model: FakeModel | None = None, max_pixel_steps: int = 512 * 512 * 50 * 4, **kwargs: Any
    ) -> tuple[LocalAdapter, FakeModel]:
        model = model or FakeModel()
        runner = ModelRunner(lambda: model)
        profile = runner.start(timeout=10)
        limits = Limits.for_model(profile, max_pixel_steps=max_pixel_steps)
        adapter = LocalAdapter(runner, limits, tmp_path / "outputs", **kwargs)
        made.append(adapter)
        return adapter, model

    yield make
    for adapter in made:
        adapter.shutdown_model(timeout=10)
        adapter.close()

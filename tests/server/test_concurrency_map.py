"""The concurrency map (``docs/architecture.md``) against the threads of a running app.

The table between ``<!-- concurrency-map -->`` markers names every thread, task and pool; this test
launches the app (the model in its own process, then in a thread), serves a request with live
previews through the queue, and checks that every thread started in the server process is one the
map names for it, and that the app's own named threads are there. A thread the map does not name
(a new one, or a renamed one) fails it.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from tests.helpers import ROOT, api_fn_index, queue_call, raw_request, running_app

MAP = ROOT / "docs" / "architecture.md"


def the_map() -> list[tuple[str, str, str]]:
    """(process, name pattern, kind) for every row of the map."""
    text = MAP.read_text()
    table = text.split("<!-- concurrency-map -->")[1].split("<!-- /concurrency-map -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        process, names, kind, *_ = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", names):
            rows.append((process, name, kind))
    return rows


def pattern(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(name).replace("N", r"\d+") + "$")


def unmapped(process: str, names: set[str]) -> set[str]:
    patterns = [pattern(n) for p, n, kind in the_map() if p == process and "task" not in kind]
    return {n for n in names if not any(p.match(n) for p in patterns)}


def test_the_map_names_each_owner_once_with_a_kind_and_a_way_in() -> None:
    rows = the_map()
    assert ("model", "gpu-worker", "thread") in rows and ("server", "model-stream", "thread") in rows
    assert len({(p, n) for p, n, _ in rows}) == len(rows), "a name twice in one process"
    assert unmapped("server", {"rogue-thread"}) == {"rogue-thread"}  # the check can fail
    assert unmapped("server", {"prep-finalize_3", "model-pipe-12"}) == set()


@pytest.mark.parametrize("side", ["process", "thread"])
def test_every_thread_of_a_running_app_is_on_the_map(tmp_path: Path, side: str) -> None:
    from pipeline.request import FIELDS

    # Thread objects, not idents: an ident is reused once its thread ends, so a thread started
    # here can carry the ident of one that was alive before and has ended since.
    before = set(threading.enumerate())
    with running_app(tmp_path, "--model-side", side) as (url, _demo, _adapter):
        raw = raw_request(live_preview=True, num_inference_steps=8)
        assert queue_call(url, api_fn_index(url), [raw[f] for f in FIELDS])["success"]
        started = {t.name for t in threading.enumerate() if t not in before}
        assert unmapped("server", started) == set(), f"threads the map does not name: {unmapped('server', started)}"
        own = {"model-stream", "output-sweeper", "prep-finalize_0"} | (
            {"gpu-worker"} if side == "thread" else {"model-pipe-0"}
        )
        assert own <= started, own - started

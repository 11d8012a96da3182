from __future__ import annotations

import os
from pathlib import Path

from pipeline.serving.sweeper import Sweeper

NOW = 1_000_000.0


def _file(path: Path, size: int, age: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age, NOW - age))
    return path


def test_deletes_by_age_then_oldest_first_over_budget(tmp_path: Path) -> None:
    a, b = tmp_path / "out", tmp_path / "gradio"
    old = _file(a / "day" / "old.png", 100, age=7200)
    mid = _file(b / "hash1" / "mid.png", 400, age=600)
    new = _file(a / "day" / "new.png", 400, age=300)
    fresh = _file(b / "hash2" / "fresh.png", 400, age=5)  # younger than min_age: never for size
    sweeper = Sweeper([a, b], max_bytes=800, max_age=3600, min_age=60, clock=lambda: NOW)
    stats = sweeper.sweep_once()
    assert not old.exists() and not mid.exists()
    assert new.exists() and fresh.exists()
    assert not (b / "hash1").exists()  # emptied folders go too
    assert (stats.files, stats.bytes, stats.deleted) == (2, 800, 2)


def test_within_budget_nothing_is_deleted(tmp_path: Path) -> None:
    files = [_file(tmp_path / f"{i}.png", 10, age=i) for i in range(5)]
    stats = Sweeper([tmp_path], max_bytes=10_000, max_age=3600, clock=lambda: NOW).sweep_once()
    assert all(f.exists() for f in files) and stats.deleted == 0 and stats.files == 5


def test_the_thread_is_named_and_stops(tmp_path: Path) -> None:
    import threading

    sweeper = Sweeper([tmp_path], max_bytes=1, max_age=1, interval=0.01)
    sweeper.start()
    assert "output-sweeper" in [t.name for t in threading.enumerate()]
    sweeper.stop()
    assert "output-sweeper" not in [t.name for t in threading.enumerate()]

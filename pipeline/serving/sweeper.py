"""Keeps the app's generated files within an age and size budget, on a thread the app owns.

Gradio's own ``delete_cache`` sweeper can stop silently under load (a "Set changed size during
iteration" in its loop), after which its cache grows without bound; so this app sweeps both its
output folder and Gradio's cache folder itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepStats:
    files: int
    bytes: int
    deleted: int


class Sweeper:
    """Deletes files older than ``max_age`` and, oldest first, any beyond ``max_bytes``.

    Files younger than ``min_age`` are never deleted for size, so a result is not swept away
    between being written and being downloaded.
    """

    def __init__(
        self,
        folders: Sequence[Path],
        *,
        max_bytes: int,
        max_age: float,
        min_age: float = 10.0,
        interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folders = list(folders)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.min_age = min_age
        self.interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="output-sweeper", daemon=True)
        self.last = SweepStats(0, 0, 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                self.sweep_once()
            except Exception:  # a bad sweep must not end the sweeping
                log.exception("sweep failed")
            self._stop.wait(self.interval)

    def sweep_once(self) -> SweepStats:
        now = self._clock()
        files: list[tuple[float, int, Path]] = []
        for folder in self.folders:
            for root, _dirs, names in os.walk(folder):
                for name in names:
                    path = Path(root) / name
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue
                    files.append((st.st_mtime, st.st_size, path))
        files.sort()
        deleted = 0
        total = sum(size for _, size, _ in files)
        kept: list[tuple[float, int, Path]] = []
        for mtime, size, path in files:  # oldest first
            too_old = now - mtime > self.max_age
            over_budget = total > self.max_bytes and now - mtime > self.min_age
            if (too_old or over_budget) and _unlink(path):
                deleted += 1
                total -= size
                continue
            kept.append((mtime, size, path))
        for folder in self.folders:
            _remove_empty_dirs(folder)
        self.last = SweepStats(len(kept), total, deleted)
        if deleted:
            log.info("swept %d file(s); %d left, %.1f MiB", deleted, len(kept), total / 2**20)
        return self.last


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError:
        log.warning("could not delete %s", path, exc_info=True)
        return False


def _remove_empty_dirs(folder: Path) -> None:
    for root, dirs, files in os.walk(folder, topdown=False):
        if Path(root) != folder and not dirs and not files:
            with contextlib.suppress(OSError):  # something was written there meanwhile
                Path(root).rmdir()

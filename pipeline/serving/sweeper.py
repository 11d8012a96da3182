"""Keeps the app's generated files within an age and size budget, on a thread the app owns.

Gradio's own ``delete_cache`` sweeper can stop silently under load (a "Set changed size during
iteration" in its loop), after which its cache grows without bound; so this app sweeps both its
output folder and Gradio's cache folder itself.

The size budget is shared so that no one can shrink another's part. Each identity's images live
in a folder of its own (``owners.owner_folder``: ``<day>/u-<keyed hash>/``). The first
``--max-users-on-disk`` identities (by their oldest file on disk) each have a fixed floor, the
budget over that number; identities beyond them are refused storage: their images are delivered,
then, over budget, deleted first, after the files no identity owns (previews, Gradio's copies).
Then the oldest files of identities above their floor go, never below it. An identity within its
floor keeps its images until they age out, whatever any number of others write. (An even share of
the budget over the identities holding files, as before, shrank with every identity an attacker
brought.) A zip is in its owner's folder and counts in its share.
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

from .owners import OWNER_PREFIX

log = logging.getLogger(__name__)
# An empty folder that this sweep did not empty goes once it has been empty this long: a younger one
# is about to be written into. Gradio makes folders in its temp folder at start (``vibe_edit_history``)
# and a cache folder before each file: a sweep between the two once failed an app's start.
EMPTY_DIR_AGE = 120.0


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
        max_owners: int = 32,
        clock: Callable[[], float] = time.time,
        on_deleted: Callable[[set[str]], object] | None = None,
    ) -> None:
        self.folders = list(folders)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.min_age = min_age
        self.max_owners = max(1, max_owners)  # identities with a floor of the budget (--max-users-on-disk)
        self.interval = interval
        self._clock = clock
        self.on_deleted = on_deleted  # told the paths of each sweep's deleted files (Gradio's temp-file sets)
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
        files: list[tuple[float, int, Path, str]] = []  # (mtime, size, path, owner; "" for no one)
        inodes: set[tuple[int, int]] = set()  # an upload's links (``upload_route``) are one file's bytes
        for folder in self.folders:
            for root, _dirs, names in os.walk(folder):
                owner = _owner_of(Path(root), folder)
                for name in names:
                    if name.startswith("."):
                        continue  # the owner folders' key (``owners.KEY_FILE``), never swept
                    path = Path(root) / name
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue
                    counted = st.st_nlink > 1 and (st.st_dev, st.st_ino) in inodes
                    inodes.add((st.st_dev, st.st_ino))
                    files.append((st.st_mtime, 0 if counted else st.st_size, path, owner))
        files.sort()
        deleted: set[str] = set()
        for mtime, _size, path, _owner in files:  # 1. what has aged out, whoever owns it
            if now - mtime > self.max_age and _unlink(path):
                deleted.add(str(path))
        kept = [f for f in files if str(f[2]) not in deleted]
        for victim in self._over_budget(kept, now):  # 2. over budget: the unowned, then the shares' excess
            if _unlink(victim):
                deleted.add(str(victim))
        kept = [f for f in kept if str(f[2]) not in deleted]
        for folder in self.folders:
            _remove_empty_dirs(folder, now - EMPTY_DIR_AGE, {str(Path(d).parent) for d in deleted})
        if deleted and self.on_deleted is not None:
            self.on_deleted(deleted)
        self.last = SweepStats(len(kept), sum(size for _, size, _, _ in kept), len(deleted))
        if deleted:
            log.info("swept %d file(s); %d left, %.1f MiB", len(deleted), len(kept), self.last.bytes / 2**20)
        return self.last

    def _over_budget(self, files: list[tuple[float, int, Path, str]], now: float) -> list[Path]:
        """Which files to delete, oldest first within each step, to get ``files`` (oldest first) within budget.

        1. files no identity owns; 2. every file of the identities that did not fit (beyond the
        first ``max_owners`` by their oldest file on disk); 3. the oldest files of the identities
        above the floor (``max_bytes / max_owners``), the largest first, never below the floor.
        The floors of the identities that fit add up to the budget, so one within its floor is
        never touched, however many identities an attacker brings.
        """
        total = sum(size for _, size, _, _ in files)
        if total <= self.max_bytes:
            return []
        usage: dict[str, int] = {}
        for _, size, _, owner in files:  # oldest first: an identity's first entry is its seniority
            if owner:
                usage[owner] = usage.get(owner, 0) + size
        fitting = set(list(usage)[: self.max_owners])
        sweepable = [f for f in files if now - f[0] > self.min_age]
        victims: list[Path] = []
        for unowned in (True, False):  # 1, then 2
            for _mtime, size, path, owner in sweepable:
                if total <= self.max_bytes:
                    return victims
                if (not owner) == unowned and owner not in fitting:
                    victims.append(path)
                    total -= size
        floor = self.floor
        oldest_first: dict[str, list[tuple[int, Path]]] = {}
        for _mtime, size, path, owner in sweepable:
            if owner in fitting and usage[owner] > floor:
                oldest_first.setdefault(owner, []).append((size, path))
        for owner in sorted(oldest_first, key=usage.__getitem__, reverse=True):  # 3, the largest first
            for size, path in oldest_first[owner]:
                if total <= self.max_bytes or usage[owner] <= floor:
                    break
                victims.append(path)
                usage[owner] -= size
                total -= size
        return victims

    @property
    def floor(self) -> int:
        """The bytes each identity that fits keeps whatever others write."""
        return self.max_bytes // self.max_owners


def _owner_of(directory: Path, top: Path) -> str:
    """The identity folder (``u-...``) ``directory`` is in: below a day folder of ``top`` (outputs), or
    at its top (uploads: ``u-.../uploads``, ``web.door.upload_route``); "" if none. An identity's uploads
    count in its share with its pictures."""
    try:
        parts = directory.relative_to(top).parts
    except ValueError:
        return ""
    for part in parts[:2]:
        if part.startswith(OWNER_PREFIX):
            return part
    return ""


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError:
        log.warning("could not delete %s", path, exc_info=True)
        return False


def _remove_empty_dirs(folder: Path, before: float, emptied: set[str]) -> None:
    """Empty folders under ``folder``: those this sweep emptied (``emptied``: the deleted files' folders,
    and the folders above one removed), and any other last changed before ``before``. A fresh empty
    one is about to be written into (a folder Gradio makes at start, a cache folder between its mkdir
    and its file)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        path = Path(root)
        if path == folder or files or any((path / d).exists() for d in dirs):
            continue
        if root in emptied or _changed(path) < before:
            with contextlib.suppress(OSError):  # something was written there meanwhile
                path.rmdir()
                emptied.add(str(path.parent))


def _changed(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")

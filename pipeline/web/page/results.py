"""What the page keeps of its results: a summary of the last one, the tab's history, a zip of it all.

The history is the server's own record (``SessionResults``): the generate handler files each
finished request's paths and parameters under its session, and the page's events read them from
there. No event takes a path or a record from the client, so nothing a client sends can make the
zip read another file, or zip a zip. The functions over plain values are pure; ``write_zip`` runs
on Gradio's worker threads.
"""

from __future__ import annotations

import html
import json
import threading
import uuid
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

from ...serving.postprocess import output_folder, write_then_rename
from .mode_panel import MODE_LABELS

HISTORY_SIZE = 24  # images kept per tab, newest first
MAX_SESSIONS = 10_000  # sessions whose results are kept (Gradio's own session capacity); the oldest go first
MAX_ZIP_BYTES = 256 * 2**20  # a zip holds the newest history images up to this size
PARAMETERS = (
    "prompt", "negative_prompt", "width", "height", "num_inference_steps", "guidance_scale", "scheduler", "lora",
    "lora_scale",
)  # fmt: skip


# A mode as the page names it (its heading, the summary).
MODE_NAMES = MODE_LABELS  # the page's words for the modes


def summary_markdown(info: Any) -> str:
    """The info record as one readable line: the mode (and strength) where it is not text to image,
    seed, size, steps, guidance, sampler, time taken."""
    if not isinstance(info, dict) or info.get("status") != "done":
        return ""
    seeds = info.get("seeds") or [info.get("seed")]
    seed = f"**Seed** {seeds[0]}" if len(seeds) == 1 else f"**Seeds** {seeds[0]}–{seeds[-1]}"
    durations = info.get("durations_ms") or {}
    took = durations.get("total", 0) / 1000
    waited = durations.get("gpu_wait", 0) / 1000
    parts = [
        seed,
        f"**Size** {info.get('width')}×{info.get('height')}",
        f"**Steps** {info.get('num_inference_steps')}",
        f"**Guidance** {info.get('guidance_scale', 0):g}",
    ]
    if info.get("scheduler"):
        parts.append(f"**Sampler** {html.escape(str(info['scheduler']))}")
    mode = info.get("mode") or "text"
    if mode != "text":  # what the picture came from, and (where it applies) how far it was redrawn
        strength = f" · **Strength** {info['strength']:g}" if isinstance(info.get("strength"), (int, float)) else ""
        parts.insert(0, f"**{MODE_NAMES.get(mode, html.escape(str(mode)))}**{strength}")
    if info.get("lora") not in (None, "", "none"):
        parts.append(f"**LoRA** {html.escape(str(info['lora']))} × {info.get('lora_scale', 1):g}")
    parts.append(f"**Time** {took:.2f} s" + (f" (waited {waited:.2f} s)" if waited >= 0.01 else ""))
    return " · ".join(parts)


def _path_of(item: Any) -> str | None:
    """A gallery value's item as a path: Gradio's preprocess gives (path, caption); be lenient."""
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    if isinstance(item, dict):
        item = item.get("path") or (item.get("image") or {}).get("path")
    return item if isinstance(item, str) else None


def add_results(history: Any, gallery: Any, info: Any) -> list[dict[str, Any]]:
    """The history with a finished request's images in front (once per request), cut to HISTORY_SIZE.

    ``gallery`` is the result gallery's value (its images in order), ``info`` the request's info
    record; anything but a finished record (a progress record, an error) leaves the history as it is.
    """
    entries = [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    if not isinstance(info, dict) or info.get("status") != "done" or not isinstance(gallery, list):
        return entries
    request_id = info.get("request_id")
    if any(e.get("request_id") == request_id for e in entries):
        return entries
    seeds = info.get("seeds") or []
    params = {key: info.get(key) for key in PARAMETERS if key in info or key not in ("lora", "lora_scale")}
    new = [
        {"path": path, "request_id": request_id, "params": {**params, "seed": seed}}
        for path, seed in zip((_path_of(item) for item in gallery), seeds)
        if path is not None
    ]
    return (new + entries)[:HISTORY_SIZE]


def history_items(history: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The history gallery's value: each image with its prompt and seed."""
    items = []
    for entry in history:
        params = entry["params"]
        prompt = str(params.get("prompt") or "")
        short = prompt if len(prompt) <= 40 else prompt[:39] + "…"
        items.append((entry["path"], f"{short} · seed {params.get('seed')}"))
    return items


def restore(history: Any, index: Any) -> dict[str, Any] | None:
    """The parameters of the history's image ``index`` (None if there is no such image)."""
    if not isinstance(history, list) or not isinstance(index, int) or not 0 <= index < len(history):
        return None
    return dict(history[index]["params"])


def write_zip(history: Any, out_dir: Path, owner: str | None = None, max_bytes: int = MAX_ZIP_BYTES) -> Path | None:
    """The history images still on disk, newest first up to ``max_bytes``, and their parameters as
    JSON, in one zip in ``owner``'s output folder: the sweeper counts it in that identity's share and
    ages it out with the images. PNGs are stored, not recompressed. None when no image is left.
    """
    entries = [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    files, size = [], 0
    for entry in entries:
        file = Path(entry["path"])
        try:
            size += file.stat().st_size
        except OSError:
            continue  # swept away
        if size > max_bytes:
            break
        files.append((entry, file))
    if not files:
        return None
    path = output_folder(out_dir, owner) / f"images-{uuid.uuid4().hex[:12]}.zip"

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            records = []
            for k, (entry, file) in enumerate(files, 1):
                name = f"{k:02d}-seed{entry['params'].get('seed')}.png"
                archive.write(file, name)
                records.append({"file": name, **entry["params"]})
            archive.writestr("parameters.json", json.dumps(records, ensure_ascii=False, indent=1))

    return write_then_rename(path, write)


class SessionResults:
    """Each session's history, as the server wrote it, and the zip made of it (reused while unchanged).

    Written by the generate handler (event loop) and read by the page's events (Gradio's worker
    threads), under one lock held for a dict operation at a time.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._histories: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._last: dict[str, dict[str, Any]] = {}  # session -> its last finished request's record
        self._zips: dict[str, tuple[tuple[str, ...], Path]] = {}  # session -> (the history it holds, its zip)

    def add(self, session: str | None, paths: Sequence[Any], info: dict[str, Any]) -> None:
        """File a finished request's images (``paths``, in order) and its record under ``session``."""
        if not session:
            return
        record = {"status": "done", **info}
        with self._lock:
            history = add_results(self._histories.pop(session, []), [str(p) for p in paths], record)
            self._histories[session] = history
            self._last[session] = record
            while len(self._histories) > self.max_sessions:
                old, _ = self._histories.popitem(last=False)
                self._last.pop(old, None)
                self._zips.pop(old, None)

    def history(self, session: str | None) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._histories.get(session or "", []))

    def last(self, session: str | None) -> dict[str, Any] | None:
        with self._lock:
            return self._last.get(session or "")

    def zip(self, session: str | None, out_dir: Path, owner: str | None) -> Path | None:
        """The session's zip: the one made before while the history is the same and it is on disk."""
        history = self.history(session)
        key = tuple(e["path"] for e in history)
        with self._lock:
            made = self._zips.get(session or "")
        if made is not None and made[0] == key and made[1].is_file():
            return made[1]
        path = write_zip(history, out_dir, owner)
        if path is not None and session:
            with self._lock:
                self._zips[session] = (key, path)
        return path

"""What the page keeps of its results: a summary of the last one, the tab's history, a zip of it all.

The history lives in the session (``gr.State``: on the server, per browser tab): it holds file
paths the server wrote itself, so nothing a client sends can make the zip read another file.
Pure functions over plain values, except ``write_zip``, which runs on Gradio's worker threads.
"""

from __future__ import annotations

import html
import json
import uuid
import zipfile
from pathlib import Path
from typing import Any

from ..serving.postprocess import day_folder, write_then_rename

HISTORY_SIZE = 24  # images kept per tab, newest first
PARAMETERS = ("prompt", "negative_prompt", "width", "height", "num_inference_steps", "guidance_scale", "scheduler")


def summary_markdown(info: Any) -> str:
    """The info record as one readable line: seed, size, steps, guidance, sampler, time taken."""
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
    params = {key: info.get(key) for key in PARAMETERS}
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


def write_zip(history: Any, out_dir: Path) -> Path | None:
    """Every history image still on disk, and their parameters as JSON, in one zip in the output folder.

    Written into ``out_dir``'s day folder, so the output sweeper ages it out with the images.
    PNGs are stored, not recompressed. None when no image is left.
    """
    entries = [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    files = [(e, Path(e["path"])) for e in entries if Path(e["path"]).is_file()]
    if not files:
        return None
    path = day_folder(out_dir) / f"images-{uuid.uuid4().hex[:12]}.zip"

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            records = []
            for k, (entry, file) in enumerate(files, 1):
                name = f"{k:02d}-seed{entry['params'].get('seed')}.png"
                archive.write(file, name)
                records.append({"file": name, **entry["params"]})
            archive.writestr("parameters.json", json.dumps(records, ensure_ascii=False, indent=1))

    return write_then_rename(path, write)

"""What the stand-in saw of each ``@spaces.GPU`` call: ``spaces.calls`` and, if ``SPACES_STUB_LOG`` names a file,
one JSON line per call appended to it (written by the calling process once the call is over)."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

calls: list[dict[str, Any]] = []
_lock = threading.Lock()


def new_record(function: str, size: str | None, duration: float, request: Any) -> dict[str, Any]:
    return {
        "function": function,
        "size": size,
        "duration": duration,
        "saw_request": request is not None,
        "session_hash": getattr(request, "session_hash", None) if request is not None else None,
        "pid_parent": os.getpid(),
        "pid_child": None,
        "yields": 0,
        "stopped": False,
        "error": None,
    }


def write(record: dict[str, Any]) -> None:
    with _lock:
        calls.append(record)
        if path := os.environ.get("SPACES_STUB_LOG"):
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

"""glibc's malloc, set for a server that allocates and frees images of about a megabyte per request.

glibc serves an allocation over its mmap threshold (128 KiB at first) with a fresh ``mmap`` and
returns it with ``munmap`` when freed; it raises the threshold as such blocks are freed, but it
also gives the top of each heap back to the kernel once more than the trim threshold is free
there. Either way the next image's buffers are new pages: the kernel zeroes each one on its first
touch. Measured on the null simulated device (``docs/performance-notes.md``, "malloc"): 250-430
minor page faults per 512 px request in the server process with glibc's defaults, 1.6 with these
settings, and the server's CPU per request 12 % lower.

The trim threshold keeps up to 128 MiB free at the top of each of glibc's arenas (one per thread
that met contention, up to eight per core): after a burst of large bodies (six of 51 MiB) the
server held 0.6-1.3 GB it no longer used. ``trim()`` gives every arena's free pages back; the front
door calls it when a large body's request has ended (``web.door.frontdoor.FrontDoor._large``), which
costs milliseconds once per large body, and nothing to the requests of ordinary size.

Both processes call ``tune()`` once at start: the server in ``app.main`` and the model process in
``engine.hosting.child``. A user's own settings (``GLIBC_TUNABLES`` with a malloc tunable, or the older
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``) win: then nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Mapping

log = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Requests up to this size come from the heap and are reused. 32 MiB is glibc's ceiling for it on
# 64-bit (half its heap size), room for a 2048 px RGB image (12 MiB) and a model's mid-size tensors.
MMAP_THRESHOLD = 32 * 2**20
# Free memory at the top of a heap is given back to the kernel only above this.
TRIM_THRESHOLD = 128 * 2**20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def user_has_settings(environ: Mapping[str, str]) -> bool:
    """Whether the user tuned malloc themselves through the environment."""
    return any(name in environ for name in USER_SETTINGS) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def tune(environ: Mapping[str, str] = os.environ) -> str:
    """Set this process's malloc thresholds. Returns ``set``, ``user`` (left as the user set it) or
    ``unavailable`` (not Linux, or a C library without ``mallopt``, such as musl's stub)."""
    if user_has_settings(environ):
        return "user"
    if not sys.platform.startswith("linux"):
        return "unavailable"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "unavailable"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; musl's returns 0 and changes nothing
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "unavailable"
    log.info("malloc thresholds set: mmap %d MiB, trim %d MiB", MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20)
    return "set"


def trim() -> bool:
    """Give the free memory of every arena back to the kernel (glibc's ``malloc_trim(0)``); False
    where there is no such call (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))

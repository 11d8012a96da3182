"""Whose files are whose on disk, in names that reveal nobody.

Each identity's images live in a folder of its own under each day folder, ``u-<name>``, and that
name appears in every image URL. The name is an HMAC of the identity under a key the server keeps,
so a URL passed around cannot be traced back to an address or a login: without the key, searching
every IPv4 address finds nothing. (An unsalted hash of ``addr:IP`` was recovered from one URL in
0.04 s by searching a /16.)

The key is made at first start, 32 random bytes in ``<out_dir>/.owner-key`` (mode 0600, never
served: the front door refuses hidden files, the sweeper skips them), so names stay the same across
restarts; replicas that write one output folder from several machines give the same
``--output-key``. Folders made under an older naming keep working: the sweeper counts any ``u-``
folder as one identity's, and their files age out as before. Thread-safe (encoders run on a pool).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

OWNER_PREFIX = "u-"  # an identity's folder under each day folder (``owner_folder``)
SHARED_FOLDER = "shared"  # files no identity asked for
KEY_FILE = ".owner-key"

_keys: dict[Path, bytes] = {}
_lock = threading.Lock()


def use_key(out_dir: Path, secret: str) -> None:
    """Name ``out_dir``'s owner folders with ``secret`` (``--output-key``) instead of the kept key."""
    with _lock:
        _keys[out_dir.resolve()] = hashlib.sha256(b"t2i-output-key:" + secret.encode()).digest()


def key_of(out_dir: Path) -> bytes:
    """The key of ``out_dir``'s owner folders: given, read from its key file, or made there now."""
    where = out_dir.resolve()
    with _lock:
        key = _keys.get(where)
        if key is None:
            key = _keys[where] = _kept_key(where)
        return key


def owner_folder(owner: str | None, key: bytes) -> str:
    """The folder name of an identity's files: ``u-`` and an HMAC of it under ``key``."""
    if owner is None:
        return SHARED_FOLDER
    return OWNER_PREFIX + hmac.new(key, owner.encode(), hashlib.sha256).hexdigest()[:24]


def forget_keys() -> None:
    """Drop the keys read so far (a restart, for the tests)."""
    with _lock:
        _keys.clear()


def _kept_key(out_dir: Path) -> bytes:
    path = out_dir / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return bytes.fromhex(path.read_text().strip())
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"{KEY_FILE}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)  # atomic: of two processes starting at once, one key wins, and both read it
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return bytes.fromhex(path.read_text().strip())

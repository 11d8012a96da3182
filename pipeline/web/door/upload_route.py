"""The upload route: an image file in, kept as its sender's, for its sender's own requests only.

Gradio's own ``/gradio_api/upload`` stores any file from anyone and answers its absolute server
path; this app's route replaces it (listed before Gradio's routes, so it wins). What it takes:

- **images only,** sniffed from the bytes (``uploads.sniff``: PNG, JPEG or WebP; never by the
  name or the declared type): anything else is 415, before anything is written;
- **one file at a time, at most ``MAX_UPLOAD_BYTES``** (the connection's body cap for this route,
  ``UPLOAD_BODY_BYTES``, refuses a larger body with 413 before it is read: ``httplimits``);
- **a rate and a share per identity** (who the front door says the caller is): at most
  ``UPLOADS_PER_MINUTE`` uploads a minute, and at most ``UPLOAD_SHARE_BYTES`` of live uploads on
  disk; past either, 429 with ``Retry-After``. The HTTP APIs' inline pictures (base64, multipart)
  count against the same minute (``UploadBook.charge``), before any of them is decoded;
- **kept as its sender's:** the file is written under a random name in the sender's own folder
  (``owners.owner_folder``: a name that reveals nobody), and ``UploadBook`` remembers whose it is.
  A request may name only a file its own identity uploaded (``web.door.inputs`` checks at the join);
  anyone else's path, a URL or any other server path is refused by name before Gradio touches it.
- **and its session's:** an upload request carries no session (neither Gradio's page nor its
  clients send one), so an upload belongs to the session of the first request that names it
  (``UploadBook.owned``; the join's ``session_hash``; a REST ``/call`` has none, and its uploads
  belong to the identity's REST calls): another tab or client of the same identity that names it
  later is refused. Every upload answers its own path, the same bytes included (a hard link to
  the bytes already kept, not counted again), so a path is only ever known to the one request
  that uploaded it.
  Gradio then copies the file into its cache, and the handler reads that copy's bytes
  (``handler.with_upload_bytes``).
- **swept:** an upload lives ``UPLOAD_KEEP_SECONDS`` (the book forgets and deletes it then), and the
  output sweeper ages the folder like any other.

Decoding is not done here: ``uploads.read_image`` decodes (with its caps) when the request that
names the file is validated, off the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ...serving.owners import key_of, owner_folder
from ...uploads import MAX_UPLOAD_BYTES, sniff

log = logging.getLogger(__name__)

UPLOAD_PATH = "/gradio_api/upload"
UPLOAD_BODY_BYTES = MAX_UPLOAD_BYTES + 64 * 1024  # the file and its multipart framing
UPLOADS_PER_MINUTE = 30
UPLOAD_SHARE_BYTES = 4 * MAX_UPLOAD_BYTES  # one identity's live uploads on disk
UPLOAD_KEEP_SECONDS = 15 * 60
MAX_LIVE_UPLOADS = 2048  # one identity's live paths, the same bytes' links included (the book's memory)
NO_SESSION = ""  # the session of a request that has none (a REST ``/call``)
UPLOAD_FOLDER = "uploads"
_SUFFIX = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}


class UploadRefused(Exception):
    def __init__(self, status: int, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass
class Upload:
    path: Path
    owner: str
    size: int  # 0 for a link to bytes already counted
    at: float
    session: str | None = None  # the session of the first request that named it: only it may name it again


class UploadBook:
    """Whose upload is whose, each identity's rate and share. Thread-safe (the route runs on the
    event loop; a request's handler reads its file on a worker thread)."""

    def __init__(self, folder: Path, clock: Any = time.monotonic) -> None:
        self.folder = folder
        self._clock = clock
        self._lock = threading.Lock()
        self._by_path: dict[str, Upload] = {}
        self._times: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._by_content: dict[tuple[str, bytes], str] = {}  # (owner, digest) -> its live upload's path

    def store(self, owner: str, data: bytes) -> Path:
        """Keep ``data`` (an image's bytes) as ``owner``'s; its path, or ``UploadRefused``."""
        if len(data) > MAX_UPLOAD_BYTES:
            raise UploadRefused(413, f"files: the file is over {MAX_UPLOAD_BYTES // 2**20} MiB")
        kind = sniff(data)
        if kind is None:
            raise UploadRefused(415, "files: not a PNG, JPEG or WebP image (only those are taken)")
        now = self._clock()
        digest = hashlib.sha256(data).digest()
        with self._lock:
            self._forget_old(now)
            live = sum(1 for u in self._by_path.values() if u.owner == owner)
            if live >= MAX_LIVE_UPLOADS:
                raise UploadRefused(
                    429, f"files: at most {MAX_LIVE_UPLOADS} uploads are kept for you", UPLOAD_KEEP_SECONDS / 4
                )
            folder = self.folder / owner_folder(owner, key_of(self.folder)) / UPLOAD_FOLDER
            path = folder / f"{secrets.token_hex(16)}{_SUFFIX[kind]}"
            # The same bytes again from the same owner (the page's image editor sends its picture, layer
            # and composite again at every change and at Generate: 20 uploads for one inpainting): a new
            # path (it will belong to the session that names it) linked to the bytes already kept, not
            # counted against the rate or the share again; the kept copy lives as long as its last link.
            same = self._by_path.get(self._by_content.get((owner, digest), ""))
            if same is not None and _linked(same.path, path):
                same.at = now
                self._by_path[str(path)] = Upload(path, owner, 0, now)
                return path
            self._rate(owner, 1, now, "files")
            held = sum(u.size for u in self._by_path.values() if u.owner == owner)
            if held + len(data) > UPLOAD_SHARE_BYTES:
                raise UploadRefused(
                    429,
                    f"files: your uploads of the last {UPLOAD_KEEP_SECONDS // 60} minutes take "
                    f"{held / 2**20:.1f} MiB; the share is {UPLOAD_SHARE_BYTES // 2**20} MiB",
                    UPLOAD_KEEP_SECONDS / 4,
                )
            self._times[owner].append(now)
            self._by_path[str(path)] = Upload(path, owner, len(data), now)
            self._by_content[owner, digest] = str(path)
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def charge(self, owner: str, pictures: int, field: str) -> None:
        """``pictures`` sent inline to the HTTP APIs (base64, multipart) counted as ``owner``'s uploads
        of this minute, before any of them is decoded: the upload route's rate for every picture
        that comes in. ``UploadRefused`` (429) past it, naming ``field``."""
        now = self._clock()
        with self._lock:
            self._rate(owner, pictures, now, field)
            self._times[owner].extend([now] * pictures)

    def _rate(self, owner: str, pictures: int, now: float, field: str) -> None:
        """``UploadRefused`` if ``pictures`` more would pass ``owner``'s uploads a minute (lock held)."""
        times = self._times[owner]
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) + pictures > UPLOADS_PER_MINUTE:
            wait = times[0] + 60 - now if times else 60.0
            raise UploadRefused(
                429, f"{field}: at most {UPLOADS_PER_MINUTE} pictures a minute (uploads included)", wait
            )

    def owned(self, path: Any, owner: str, session: str = NO_SESSION) -> bool:
        """Whether ``path`` is a live upload of ``owner``'s that ``session`` may name: the first
        session to name an upload takes it (an upload request carries no session); only it may
        name it again."""
        with self._lock:
            upload = self._by_path.get(str(path)) if isinstance(path, str) else None
            if upload is None or upload.owner != owner or self._clock() - upload.at >= UPLOAD_KEEP_SECONDS:
                return False
            if upload.session is None:
                upload.session = session
            return upload.session == session

    def _forget_old(self, now: float) -> None:
        for key, upload in list(self._by_path.items()):
            if now - upload.at >= UPLOAD_KEEP_SECONDS:
                del self._by_path[key]
                upload.path.unlink(missing_ok=True)
        self._by_content = {k: v for k, v in self._by_content.items() if v in self._by_path}


def _linked(kept: Path, path: Path) -> bool:
    """Whether ``path`` now names ``kept``'s bytes (a hard link; its time renewed for the sweeper)."""
    try:
        os.link(kept, path)
        os.utime(path)
    except OSError:  # gone, or a filesystem without links: a new upload then
        return False
    return True


def upload_route(book: UploadBook, on_stored: Any = None) -> Any:
    """The route's handler: ``POST /gradio_api/upload`` with one multipart ``files`` part."""

    async def upload(request: Request) -> JSONResponse:
        caller = request.scope.get("state", {}).get("t2i_caller")
        owner = getattr(caller, "key", None) or "anonymous"
        try:
            form = await request.form(max_files=1, max_fields=4, max_part_size=64 * 1024)
        except Exception as exc:  # a malformed body, or more than one file
            return JSONResponse({"detail": f"files: send one image as multipart 'files' ({exc})"}, status_code=400)
        parts = form.getlist("files")
        if len(parts) != 1 or not hasattr(parts[0], "read"):
            return JSONResponse({"detail": "files: send one image as multipart 'files'"}, status_code=400)
        data = await parts[0].read(MAX_UPLOAD_BYTES + 1)
        await form.close()
        try:
            path = await asyncio.to_thread(book.store, owner, data)  # a write of up to 20 MiB: off the loop
        except UploadRefused as exc:
            headers = {"retry-after": str(int(exc.retry_after) + 1)} if exc.retry_after else None
            return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)
        if on_stored is not None:
            on_stored(path)
        return JSONResponse([str(path)])

    return upload

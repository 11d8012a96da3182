"""``web.upload_route.UploadBook``: whose upload is whose, each identity's rate and share, and the
sweep of an upload once it has lived ``UPLOAD_KEEP_SECONDS``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.web.upload_route import (
    UPLOAD_KEEP_SECONDS,
    UPLOAD_SHARE_BYTES,
    UPLOADS_PER_MINUTE,
    UploadBook,
    UploadRefused,
)
from tests import malformed

PNG = malformed.png_bytes(malformed.noisy(16, 16))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_upload_is_its_senders_only_and_is_swept_when_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    book = UploadBook(tmp_path, clock)
    path = book.store("alice", PNG)
    assert path.read_bytes() == PNG and path.parent.name == "uploads" and "alice" not in str(path)
    assert book.owned(str(path), "alice") and not book.owned(str(path), "bob")
    assert not book.owned("/etc/passwd", "alice") and not book.owned(None, "alice")
    clock.now += UPLOAD_KEEP_SECONDS
    assert not book.owned(str(path), "alice")  # expired: no request may name it
    book.store("bob", PNG)  # any later upload sweeps the expired ones
    assert not path.exists()


def test_only_images_by_their_bytes_and_a_rate_and_a_share_per_identity(tmp_path: Path) -> None:
    clock = Clock()
    book = UploadBook(tmp_path, clock)
    with pytest.raises(UploadRefused) as refused:
        book.store("alice", malformed.svg_polyglot())
    assert refused.value.status == 415 and not list(tmp_path.rglob("*.*"))
    for _ in range(UPLOADS_PER_MINUTE):
        book.store("alice", PNG)
    with pytest.raises(UploadRefused) as refused:
        book.store("alice", PNG)
    assert refused.value.status == 429 and refused.value.retry_after > 0
    book.store("bob", PNG)  # another identity is not slowed
    clock.now += 61
    big = PNG + bytes(UPLOAD_SHARE_BYTES // 4 - len(PNG) - 1)  # just under a quarter of the share
    for _ in range(4):
        book.store("carol", big)
    with pytest.raises(UploadRefused, match="the share is"):
        book.store("carol", big)
    clock.now += UPLOAD_KEEP_SECONDS  # once they expire, the share is free again
    book.store("carol", big)

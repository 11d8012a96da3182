"""``web.door.upload_route.UploadBook``: whose upload is whose, each identity's rate and share, and the
sweep of an upload once it has lived ``UPLOAD_KEEP_SECONDS``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.web.door.upload_route import (
    NO_SESSION,
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
    for k in range(UPLOADS_PER_MINUTE):
        book.store("alice", distinct(k))
    with pytest.raises(UploadRefused) as refused:
        book.store("alice", distinct(UPLOADS_PER_MINUTE))
    assert refused.value.status == 429 and refused.value.retry_after > 0
    book.store("bob", PNG)  # another identity is not slowed
    clock.now += 61
    big = PNG + bytes(UPLOAD_SHARE_BYTES // 4 - len(PNG) - 2)  # just under a quarter of the share
    for k in range(4):
        book.store("carol", big + bytes([k]))
    with pytest.raises(UploadRefused, match="the share is"):
        book.store("carol", big + bytes([9]))
    clock.now += UPLOAD_KEEP_SECONDS  # once they expire, the share is free again
    book.store("carol", big + bytes([9]))


def distinct(k: int) -> bytes:
    return PNG + k.to_bytes(4, "big")  # the same picture, other bytes (a trailer after IEND)


def test_the_same_bytes_again_are_a_link_to_the_upload_already_kept(tmp_path: Path) -> None:
    """The page's image editor sends its picture, layer and composite again at each change and at
    Generate: the same bytes from the same owner are neither counted again nor written again, but
    each upload answers a path of its own (a hard link), which belongs to the session that names it."""
    clock = Clock()
    book = UploadBook(tmp_path, clock)
    first = book.store("alice", PNG)
    links = {book.store("alice", PNG) for _ in range(3 * UPLOADS_PER_MINUTE)}  # past the rate: not counted
    assert len(links) == 3 * UPLOADS_PER_MINUTE and first not in links
    assert all(os.path.samefile(link, first) for link in links)
    assert book.store("alice", distinct(1)) != first  # other bytes: a new upload, within the rate
    other = book.store("bob", PNG)  # another owner's same bytes are its own upload
    assert not os.path.samefile(other, first) and book.owned(str(other), "bob") and not book.owned(str(other), "alice")
    assert len({p.stat().st_ino for p in tmp_path.rglob("*.png")}) == 3
    clock.now += UPLOAD_KEEP_SECONDS - 1
    latest = book.store("alice", PNG)  # the kept bytes live as long as their latest link
    clock.now += UPLOAD_KEEP_SECONDS - 1
    assert book.owned(str(first), "alice") and book.owned(str(latest), "alice")
    assert not book.owned(str(next(iter(links))), "alice")  # an older link has expired
    clock.now += 1
    book.store("bob", distinct(2))  # any later upload sweeps the expired ones
    assert not first.exists() and not latest.exists()


def test_an_upload_belongs_to_the_session_that_names_it_first(tmp_path: Path) -> None:
    """An upload request carries no session: the first request that names the upload binds it, and
    another session of the same identity (another tab, another client) may not name it then."""
    book = UploadBook(tmp_path, Clock())
    path, link = book.store("alice", PNG), book.store("alice", PNG)
    assert book.owned(str(path), "alice", "tab-1")
    assert not book.owned(str(path), "alice", "tab-2") and not book.owned(str(path), "alice")  # nor a REST call
    assert book.owned(str(path), "alice", "tab-1")  # its session, again
    assert book.owned(str(link), "alice", "tab-2")  # the same bytes, uploaded by the other tab: its own
    rest = book.store("alice", distinct(3))
    assert book.owned(str(rest), "alice") and book.owned(str(rest), "alice", NO_SESSION)
    assert not book.owned(str(rest), "alice", "tab-1")  # a REST call's upload is not a tab's
    assert not book.owned(str(link), "bob", "tab-2")  # nor another identity's, whatever its session

"""Owner folders named by a keyed hash (issue 35 §2): no image URL can be traced to an address or a login."""

from __future__ import annotations

import hashlib
import stat
import threading
from pathlib import Path

from pipeline.serving import owners
from pipeline.serving.postprocess import output_folder


def test_the_folder_name_is_an_hmac_under_a_key_made_at_first_start_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    owners.forget_keys()
    folder = output_folder(out, "addr:203.0.113.7").name
    key_file = out / owners.KEY_FILE
    assert key_file.exists() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # Not the unsalted hash of old, from which the address was found by searching a /16 in 0.04 s:
    assert folder != owners.OWNER_PREFIX + hashlib.sha256(b"addr:203.0.113.7").hexdigest()[:20]
    # The name shows nothing of the address ("203" alone may be hex digits of the random key's HMAC:
    # 1 run in 250 failed so).
    assert "203.0.113" not in folder and "addr" not in folder and folder.startswith(owners.OWNER_PREFIX)
    owners.forget_keys()  # a restart: the same key is read back, so the same names
    assert output_folder(out, "addr:203.0.113.7").name == folder
    other = tmp_path / "other"  # another server's folder has another key
    assert output_folder(other, "addr:203.0.113.7").name != folder


def test_without_the_key_a_search_of_the_address_space_finds_nothing(tmp_path: Path) -> None:
    """The attack of issue 35, replayed: hash every address of a /16 the way the old names were made."""
    out = tmp_path / "out"
    folder = output_folder(out, "addr:198.51.7.42").name
    found = [
        f"198.51.{a}.{b}"
        for a in range(256)
        for b in range(256)
        if owners.OWNER_PREFIX + hashlib.sha256(f"addr:198.51.{a}.{b}".encode()).hexdigest()[:24] == folder
        or owners.OWNER_PREFIX + hashlib.sha256(f"addr:198.51.{a}.{b}".encode()).hexdigest()[:20] == folder
    ]
    assert found == []
    key = owners.key_of(out)  # with the key (which the server never serves) it is the HMAC
    assert owners.owner_folder("addr:198.51.7.42", key) == folder


def test_a_given_key_names_folders_alike_across_replicas_and_processes_racing_agree(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    owners.use_key(a, "shared secret")
    owners.use_key(b, "shared secret")
    assert output_folder(a, "user:ann@198.51.100.1").name == output_folder(b, "user:ann@198.51.100.1").name
    assert not (a / owners.KEY_FILE).exists()  # a given key is never written down
    racing = tmp_path / "race"
    keys: list[bytes] = []

    def first_start() -> None:
        keys.append(owners._kept_key(racing))

    threads = [threading.Thread(target=first_start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and [p.name for p in racing.iterdir()] == [owners.KEY_FILE]

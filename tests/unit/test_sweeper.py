from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.serving.owners import KEY_FILE, owner_folder
from pipeline.serving.sweeper import EMPTY_DIR_AGE, Sweeper

NOW = 1_000_000.0
KEY = b"k" * 32


def _file(path: Path, size: int, age: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age, NOW - age))
    return path


def test_deletes_by_age_then_oldest_first_over_budget(tmp_path: Path) -> None:
    a, b = tmp_path / "out", tmp_path / "gradio"
    old = _file(a / "day" / "old.png", 100, age=7200)
    mid = _file(b / "hash1" / "mid.png", 400, age=600)
    new = _file(a / "day" / "new.png", 400, age=300)
    fresh = _file(b / "hash2" / "fresh.png", 400, age=5)  # younger than min_age: never for size
    sweeper = Sweeper([a, b], max_bytes=800, max_age=3600, min_age=60, clock=lambda: NOW)
    stats = sweeper.sweep_once()
    assert not old.exists() and not mid.exists()
    assert new.exists() and fresh.exists()
    assert not (b / "hash1").exists()  # emptied folders go too
    assert (stats.files, stats.bytes, stats.deleted) == (2, 800, 2)


def test_within_budget_nothing_is_deleted(tmp_path: Path) -> None:
    files = [_file(tmp_path / f"{i}.png", 10, age=i) for i in range(5)]
    stats = Sweeper([tmp_path], max_bytes=10_000, max_age=3600, clock=lambda: NOW).sweep_once()
    assert all(f.exists() for f in files) and stats.deleted == 0 and stats.files == 5


def test_the_thread_is_named_and_stops(tmp_path: Path) -> None:
    import threading

    sweeper = Sweeper([tmp_path], max_bytes=1, max_age=1, interval=0.01)
    sweeper.start()
    assert "output-sweeper" in [t.name for t in threading.enumerate()]
    sweeper.stop()
    assert "output-sweeper" not in [t.name for t in threading.enumerate()]


def test_over_budget_only_identities_over_their_share_lose_files_and_the_unowned_go_first(tmp_path: Path) -> None:
    """Issue 26 §8: a share each; one identity writing a lot never costs another its images."""
    out = tmp_path / "out"
    day = out / "20261202"
    heavy, light = day / owner_folder("addr:198.51.100.1", KEY), day / owner_folder("addr:198.51.100.2", KEY)
    light_files = [_file(light / f"l{i}.png", 100, age=5000 - i) for i in range(3)]  # the oldest files of all
    heavy_files = [_file(heavy / f"h{i}.png", 100, age=3000 - i) for i in range(10)]
    preview = _file(out / "ab12cd" / "image.png", 100, age=100)  # a preview in Gradio's cache: nobody's
    deleted: list[set[str]] = []
    sweeper = Sweeper([out], max_bytes=800, max_age=7200, min_age=60, clock=lambda: NOW, on_deleted=deleted.append)
    stats = sweeper.sweep_once()
    assert all(f.exists() for f in light_files), "an identity within its share lost images"
    assert not preview.exists()
    # 1400 bytes, 800 allowed: the preview, then heavy's oldest, down to 500 = 800 - light's 300
    assert [f.exists() for f in heavy_files] == [False] * 5 + [True] * 5
    assert stats.bytes == 800 and stats.deleted == 6
    assert deleted == [{str(preview), *(str(f) for f in heavy_files[:5])}]  # Gradio's sets are told


def test_each_identity_that_fits_keeps_a_floor_of_the_budget_over_max_owners(tmp_path: Path) -> None:
    day = tmp_path / "20261202"
    owners = [day / owner_folder(f"addr:{k}", KEY) for k in range(3)]
    files = {k: [_file(o / f"{i}.png", 100, age=1000 - i) for i in range(4)] for k, o in enumerate(owners)}
    files[2] = files[2][:1]  # owner 2 keeps one image: under its share
    for f in (owners[2] / f"{i}.png" for i in range(1, 4)):
        f.unlink()
    Sweeper([tmp_path], max_bytes=600, max_age=7200, min_age=60, clock=lambda: NOW, max_owners=3).sweep_once()
    left = {k: sum(f.exists() for f in fs) for k, fs in files.items()}
    # 900 -> 600, the floor 200: only owners 0 and 1 are over it, and neither goes below it
    assert left[2] == 1 and sum(left.values()) == 6 and min(left[0], left[1]) >= 2, left


def test_a_folder_swept_away_between_its_mkdir_and_the_write_is_made_again(tmp_path: Path) -> None:
    """The sweeper removes empty folders, and an owner's folder is empty between ``output_folder``'s
    mkdir and its first file: a soak (tests/server/test_hostile.py) once failed a job on it
    (FileNotFoundError on the ``.png.tmp``). The writer makes the folder again and writes."""
    from pipeline.serving.postprocess import output_folder, write_then_rename

    folder = output_folder(tmp_path / "out", "addr:198.51.100.7")
    swept = []

    def write(path: Path) -> None:
        if not swept:  # the sweeper runs between the mkdir and the open, long after (its clock): the folder goes
            later = time.time() + 2 * EMPTY_DIR_AGE
            Sweeper([tmp_path / "out"], max_bytes=10**9, max_age=3600, clock=lambda: later).sweep_once()
            swept.append(not folder.exists())
        path.write_bytes(b"png")

    written = write_then_rename(folder / "r-0.png", write)
    assert swept == [True], "the sweeper did not remove the empty folder: the race was not set up"
    assert written.read_bytes() == b"png" and not (folder / "r-0.png.tmp").exists()


def test_an_empty_folder_goes_only_once_it_has_been_empty_a_while(tmp_path: Path) -> None:
    """Gradio makes ``vibe_edit_history`` in its temp folder at start, and a cache folder before each
    file: a sweep in between must not take it (an app's start once failed with FileExistsError)."""
    fresh, old = tmp_path / "vibe_edit_history", tmp_path / "20261201" / "u-x"
    fresh.mkdir()
    old.mkdir(parents=True)
    ago = time.time() - 2 * EMPTY_DIR_AGE
    os.utime(old, (ago, ago))
    os.utime(old.parent, (ago, ago))
    Sweeper([tmp_path], max_bytes=10**9, max_age=3600, clock=time.time).sweep_once()
    assert fresh.is_dir() and not old.exists()


def test_an_identitys_uploads_count_in_its_share_with_its_pictures(tmp_path: Path) -> None:
    """Uploads live at ``u-.../uploads`` (``web.door.upload_route``), outputs at ``DAY/u-...``: one owner's
    files, swept oldest first together (not the uploads first, as files of no one's would be)."""
    owner = owner_folder("addr:198.51.100.1", KEY)
    picture = _file(tmp_path / "20261204" / owner / "r-0.png", 100, age=900)  # the oldest
    uploads = [_file(tmp_path / owner / "uploads" / f"{i}.png", 100, age=300 - i) for i in range(3)]
    Sweeper([tmp_path], max_bytes=300, max_age=7200, min_age=60, clock=lambda: NOW, max_owners=4).sweep_once()
    assert not picture.exists() and all(f.exists() for f in uploads)


def test_an_uploads_links_are_its_bytes_once(tmp_path: Path) -> None:
    """The same bytes uploaded again are hard links to one file (``web.door.upload_route``): counted once,
    so ten links of 100 bytes are within a budget of 300 and nothing is swept."""
    owner = owner_folder("addr:198.51.100.1", KEY)
    kept = _file(tmp_path / owner / "uploads" / "kept.png", 100, age=300)
    links = [tmp_path / owner / "uploads" / f"link-{i}.png" for i in range(10)]
    for link in links:
        os.link(kept, link)
    stats = Sweeper([tmp_path], max_bytes=300, max_age=7200, min_age=60, clock=lambda: NOW).sweep_once()
    assert stats.deleted == 0 and stats.bytes == 100 and kept.exists() and all(f.exists() for f in links)


def test_many_identities_cannot_shrink_a_victims_floor_they_are_deleted_first(tmp_path: Path) -> None:
    """Issue 35 §7: the floor is fixed (budget / max_owners). An attacker with 200 identities (a /56
    of IPv6 is 256 /64s), each holding a little, past what fits: their files go first, and the
    victim, who came first, keeps every image within its floor however long the attack goes on."""
    day = tmp_path / "20261203"
    victim = [_file(day / owner_folder("addr:198.51.100.1", KEY) / f"v{i}.png", 100, age=3000 - i) for i in range(4)]
    attacker = [
        _file(day / owner_folder(f"addr:2001:db8:0:{k:x}::/64", KEY) / f"a{k}.png", 100, age=2000 - k)
        for k in range(200)
    ]
    zip_of_victim = _file(day / owner_folder("addr:198.51.100.1", KEY) / "images-1.zip", 100, age=100)
    sweeper = Sweeper([tmp_path], max_bytes=1600, max_age=7200, min_age=60, clock=lambda: NOW, max_owners=4)
    assert sweeper.floor == 400
    for _round in range(3):
        sweeper.sweep_once()
    # 20,500 bytes -> 1,600. The victim holds 500 (a zip counts in its share): 100 over its floor,
    # but the identities that did not fit (all but the first 3 attackers) go first, and that is enough.
    assert all(f.exists() for f in victim) and zip_of_victim.exists()
    kept = [f for f in attacker if f.exists()]
    assert attacker[:3] == kept[:3] and len(kept) <= 11, len(kept)
    assert sum(f.stat().st_size for f in tmp_path.rglob("*.png") if f.exists()) + 100 <= 1600


def test_the_identities_that_fit_are_trimmed_to_their_floor_never_below(tmp_path: Path) -> None:
    day = tmp_path / "20261203"
    victim = [_file(day / owner_folder("addr:a", KEY) / f"v{i}.png", 100, age=5000 - i) for i in range(3)]
    hog = [_file(day / owner_folder("addr:b", KEY) / f"h{i}.png", 100, age=4000 - i) for i in range(30)]
    Sweeper([tmp_path], max_bytes=1000, max_age=7200, min_age=60, clock=lambda: NOW, max_owners=2).sweep_once()
    assert all(f.exists() for f in victim)  # 300 <= the floor of 500
    assert [f.exists() for f in hog] == [False] * 23 + [True] * 7  # 3300 -> 1000: the hog's oldest go


def test_the_owner_key_file_is_never_swept(tmp_path: Path) -> None:
    key = _file(tmp_path / KEY_FILE, 64, age=10**6)
    old = _file(tmp_path / "day" / "old.png", 100, age=10**6)
    Sweeper([tmp_path], max_bytes=1, max_age=60, min_age=1, clock=lambda: NOW).sweep_once()
    assert key.exists() and not old.exists()


def test_a_folder_named_the_old_way_is_still_one_identitys(tmp_path: Path) -> None:
    """Folders made before the keyed names (``u-`` and an unsalted hash) keep their owner's floor."""
    import hashlib

    day = tmp_path / "20261202"
    legacy = day / ("u-" + hashlib.sha256(b"addr:198.51.100.3").hexdigest()[:20])
    kept = [_file(legacy / f"old{i}.png", 100, age=5000 - i) for i in range(2)]
    hog = [_file(day / owner_folder("addr:b", KEY) / f"h{i}.png", 100, age=4000 - i) for i in range(10)]
    Sweeper([tmp_path], max_bytes=600, max_age=7200, min_age=60, clock=lambda: NOW, max_owners=2).sweep_once()
    assert all(f.exists() for f in kept) and sum(f.exists() for f in hog) == 4

"""The page's summary of a result, the tab's history (bounded, restorable) and its zip."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from pipeline.serving.owners import key_of, owner_folder
from pipeline.web.page.results import (
    HISTORY_SIZE,
    SessionResults,
    add_results,
    history_items,
    restore,
    summary_markdown,
    write_zip,
)


def done(request_id: str, seeds: list[int], **params: Any) -> dict[str, Any]:
    return {
        "status": "done",
        "request_id": request_id,
        "prompt": params.get("prompt", f"prompt of {request_id}"),
        "negative_prompt": "",
        "seed": seeds[0],
        "seeds": seeds,
        "width": 96,
        "height": 64,
        "num_inference_steps": 12,
        "guidance_scale": 7.5,
        "scheduler": "Euler a",
        "durations_ms": {"total": 1234.0, "gpu_wait": 250.0},
    }


def gallery(*paths: str) -> list[tuple[str, str]]:
    """The result gallery's value as Gradio's preprocess hands it over: (path, caption)."""
    return [(path, "caption") for path in paths]


def test_the_summary_names_seed_size_steps_guidance_sampler_and_time() -> None:
    line = summary_markdown(done("r1", [7]))
    assert line == (
        "**Seed** 7 · **Size** 96×64 · **Steps** 12 · **Guidance** 7.5 · **Sampler** Euler a · "
        "**Time** 1.23 s (waited 0.25 s)"
    )
    assert summary_markdown(done("r2", [7, 8, 9])).startswith("**Seeds** 7–9 ·")
    assert summary_markdown({"status": "running", "step": 3}) == "" and summary_markdown(None) == ""


def test_results_go_in_front_once_each_and_progress_records_change_nothing() -> None:
    history = add_results([], gallery("a0.png", "a1.png"), done("a", [10, 11]))
    history = add_results(history, gallery("b0.png"), done("b", [20], prompt="second"))
    assert [e["path"] for e in history] == ["b0.png", "a0.png", "a1.png"]
    assert [e["params"]["seed"] for e in history] == [20, 10, 11]  # each image its own seed
    assert add_results(history, gallery("b0.png"), done("b", [20])) == history  # the same request again
    assert add_results(history, gallery("x.png"), {"status": "running", "request_id": "c"}) == history
    assert add_results(history, None, done("d", [1])) == history
    assert history_items(history)[0] == ("b0.png", "second · seed 20")
    lenient = add_results([], [{"image": {"path": "c.png"}, "caption": None}, ["d.png", None]], done("c", [1, 2]))
    assert [e["path"] for e in lenient] == ["c.png", "d.png"]


def test_the_history_keeps_the_last_images_only() -> None:
    history: list[dict[str, Any]] = []
    for k in range(HISTORY_SIZE + 6):
        history = add_results(history, gallery(f"{k}.png"), done(f"r{k}", [k]))
    assert len(history) == HISTORY_SIZE
    assert history[0]["path"] == f"{HISTORY_SIZE + 5}.png" and history[-1]["path"] == "6.png"


def test_restore_gives_the_selected_images_parameters() -> None:
    history = add_results([], gallery("a0.png", "a1.png"), done("a", [10, 11]))
    assert restore(history, 1) == {
        "prompt": "prompt of a",
        "negative_prompt": "",
        "width": 96,
        "height": 64,
        "num_inference_steps": 12,
        "guidance_scale": 7.5,
        "scheduler": "Euler a",
        "seed": 11,
    }
    assert restore(history, 2) is None and restore(history, -1) is None and restore("junk", 0) is None


def test_the_zip_holds_every_image_still_on_disk_and_their_parameters(tmp_path: Path) -> None:
    images = tmp_path / "cache"
    images.mkdir()
    for name in ("a0.png", "a1.png"):
        (images / name).write_bytes(b"\x89PNG " + name.encode())
    paths = [str(images / name) for name in ("a0.png", "a1.png", "swept.png")]
    history = add_results([], gallery(*paths), done("a", [10, 11, 12]))
    out = tmp_path / "outputs"
    path = write_zip(history, out, owner="addr:203.0.113.9")
    # <out>/<day>/<the owner's folder>/: swept with the images, counted in that identity's share
    assert path is not None and path.parent.parent.parent == out and path.suffix == ".zip"
    key = key_of(out)
    assert path.parent.name == owner_folder("addr:203.0.113.9", key) != owner_folder("addr:203.0.113.10", key)
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["01-seed10.png", "02-seed11.png", "parameters.json"]
        assert archive.read("02-seed11.png") == b"\x89PNG a1.png"
        records = json.loads(archive.read("parameters.json"))
    assert [r["seed"] for r in records] == [10, 11] and records[0]["prompt"] == "prompt of a"
    assert not list(out.rglob("*.tmp"))
    assert write_zip([], out) is None and write_zip(add_results([], gallery("gone.png"), done("g", [1])), out) is None


def test_each_session_keeps_the_servers_own_record_and_its_zip_is_reused_while_unchanged(tmp_path: Path) -> None:
    images = tmp_path / "outputs" / "day" / "u-x"
    images.mkdir(parents=True)
    for name in ("a0.png", "b0.png"):
        (images / name).write_bytes(b"\x89PNG " + name.encode())
    book = SessionResults(max_sessions=2)
    record = done("a", [10])
    book.add("tab1", [images / "a0.png"], {k: v for k, v in record.items() if k != "status"})
    assert [e["path"] for e in book.history("tab1")] == [str(images / "a0.png")]
    assert book.history("tab2") == [] and book.last("tab2") is None and book.history(None) == []
    assert book.last("tab1")["seeds"] == [10] and book.last("tab1")["status"] == "done"
    first = book.zip("tab1", tmp_path / "outputs", "addr:1")
    assert first is not None and book.zip("tab1", tmp_path / "outputs", "addr:1") == first  # the same history
    book.add("tab1", [images / "b0.png"], done("b", [20]))
    second = book.zip("tab1", tmp_path / "outputs", "addr:1")
    assert second is not None and second != first  # the history changed: a new zip of both
    with zipfile.ZipFile(second) as archive:
        assert archive.namelist() == ["01-seed20.png", "02-seed10.png", "parameters.json"]
    book.add("tab2", [images / "b0.png"], done("c", [1]))
    book.add("tab3", [images / "b0.png"], done("d", [2]))
    assert book.history("tab1") == []  # the oldest session went first


def test_a_zip_holds_the_newest_images_up_to_its_size_cap(tmp_path: Path) -> None:
    paths = []
    for k in range(4):
        (tmp_path / f"{k}.png").write_bytes(b"x" * 10)
        paths.append(str(tmp_path / f"{k}.png"))
    path = write_zip(add_results([], gallery(*paths), done("r", [0, 1, 2, 3])), tmp_path / "out", max_bytes=25)
    assert path is not None
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["01-seed0.png", "02-seed1.png", "parameters.json"]

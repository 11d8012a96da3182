"""The page's summary of a result, the tab's history (bounded, restorable) and its zip."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from pipeline.web.results import HISTORY_SIZE, add_results, history_items, restore, summary_markdown, write_zip


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
    assert line == ("**Seed** 7 · **Size** 96×64 · **Steps** 12 · **Guidance** 7.5 · **Sampler** Euler a · "
                    "**Time** 1.23 s (waited 0.25 s)")
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
    path = write_zip(history, out)
    assert path is not None and path.parent.parent == out and path.suffix == ".zip"  # <out>/<day>/: swept too
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["01-seed10.png", "02-seed11.png", "parameters.json"]
        assert archive.read("02-seed11.png") == b"\x89PNG a1.png"
        records = json.loads(archive.read("parameters.json"))
    assert [r["seed"] for r in records] == [10, 11] and records[0]["prompt"] == "prompt of a"
    assert not list(out.rglob("*.tmp"))
    assert write_zip([], out) is None and write_zip(add_results([], gallery("gone.png"), done("g", [1])), out) is None

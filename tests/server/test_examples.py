"""The client examples in examples/, run as a user would, against the real launched app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def url(launch: Any) -> str:
    return str(launch(name="examples")[0])


def run(script: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_generate_prints_progress_and_saves_pngs_with_their_parameters(url: str, tmp_path: Path) -> None:
    stdout = run(
        "generate.py",
        "--url",
        url,
        "--prompt",
        "a red circle on a blue background",
        "--steps",
        "12",
        "--images",
        "2",
        "--out",
        str(tmp_path),
    )
    assert "step 12/12" in stdout and stdout.count("saved ") == 2
    saved = sorted(tmp_path.glob("*.png"))
    assert len(saved) == 2
    with Image.open(saved[0]) as image:
        assert image.text["parameters"].startswith("a red circle on a blue background\n")


def test_concurrent_submits_several_and_cancels_one(url: str) -> None:
    stdout = run("concurrent_jobs.py", "--url", url, "--jobs", "4", "--cancel", "2", "--steps", "30")
    lines = stdout.splitlines()
    assert "job 2: cancelled" in lines
    finished = [line for line in lines if line.startswith("job ") and "image(s)" in line]
    assert [line.split(":")[0] for line in finished] == ["job 0", "job 1", "job 3"]

"""Hugging Face Spaces: the README's front matter makes a Gradio Space on the pinned versions."""

from __future__ import annotations

import re
from pathlib import Path


def test_the_readme_front_matter_makes_a_gradio_space_on_the_pinned_version() -> None:
    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    assert text.startswith("---\n")
    front = dict(line.split(": ", 1) for line in text.split("---\n")[1].strip().splitlines())
    pinned = re.search(r"^gradio==(\S+)$", (root / "requirements.txt").read_text(), re.M)
    assert pinned and front["sdk"] == "gradio" and front["sdk_version"] == pinned.group(1)
    assert front["app_file"] == "app.py" and (root / front["app_file"]).exists()
    assert front["title"] and front["emoji"] and 0 < len(front["short_description"]) <= 60

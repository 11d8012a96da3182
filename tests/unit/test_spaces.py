"""Hugging Face Spaces: the README's front matter makes a Gradio Space on the pinned versions."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.helpers import ROOT


def front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n")
    pairs = (line.split(": ", 1) for line in text.split("---\n")[1].strip().splitlines())
    return {key: value.strip('"') for key, value in pairs}


def test_the_readme_front_matter_makes_a_gradio_space_on_the_pinned_version() -> None:
    front = front_matter()
    pinned = re.search(r"^gradio==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert pinned and front["sdk"] == "gradio" and front["sdk_version"] == pinned.group(1)
    assert front["app_file"] == "app.py" and (ROOT / front["app_file"]).exists()
    assert front["title"] and front["emoji"] and 0 < len(front["short_description"]) <= 60


def test_the_spaces_python_version_is_one_every_pin_and_the_project_accept() -> None:
    """Spaces builds with its own default Python unless ``python_version`` names one; that default is
    older than diffusers 0.42.1 and transformers 5 accept (they need 3.11)."""
    version = Version(front_matter()["python_version"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert version in SpecifierSet(project), (version, project)
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert len(pins) >= 8
    for name, pinned in pins:
        meta = importlib.metadata.metadata(name)
        assert meta["Version"].split("+")[0] == pinned.split("+")[0], (name, meta["Version"], pinned)
        needs = meta.get("Requires-Python") or ""
        assert version in SpecifierSet(needs), f"{name}=={pinned} needs Python {needs}; the Space runs {version}"

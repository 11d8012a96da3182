"""Hugging Face Spaces: the README's front matter, and ZeroGPU (``@spaces.GPU`` with a duration from the job on
ZeroGPU hardware, a no-op anywhere else)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pipeline.protocol import InferenceJob
from pipeline.zerogpu import MAX_SECONDS, MIN_SECONDS, gpu_seconds, on_zero_gpu


def job(steps: int = 20, size: int = 512, images: int = 1) -> InferenceJob:
    return InferenceJob("r", ("p",) * images, ("",) * images, tuple(range(images)), size, size, steps, 7.5)


def stub_spaces(monkeypatch: pytest.MonkeyPatch, zero_gpu: bool) -> list[Any]:
    """A stand-in for the ``spaces`` package that records what ``spaces.GPU`` was given."""
    calls: list[Any] = []
    spaces = types.ModuleType("spaces")
    config = types.ModuleType("spaces.config")
    config.Config = types.SimpleNamespace(zero_gpu=zero_gpu)

    def gpu(duration: Any = 60) -> Any:
        def decorate(fn: Any) -> Any:
            def on_gpu(*args: Any, **kwargs: Any) -> Any:
                calls.append(("call", duration(*args, **kwargs) if callable(duration) else duration))
                return fn(*args, **kwargs)
            calls.append(("decorated", fn))
            return on_gpu
        return decorate

    spaces.GPU = gpu
    spaces.config = config
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    monkeypatch.setitem(sys.modules, "spaces.config", config)
    return calls


def generate(j: InferenceJob, stop: Any, on_step: Any) -> str:
    return f"ran {j.request_id}"


def test_without_spaces_the_function_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError
    assert on_zero_gpu(generate) is generate


def test_spaces_on_other_hardware_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_spaces(monkeypatch, zero_gpu=False)
    assert on_zero_gpu(generate) is generate and calls == []


def test_on_zero_gpu_the_function_is_decorated_with_a_duration_from_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_spaces(monkeypatch, zero_gpu=True)
    wrapped = on_zero_gpu(generate)
    assert wrapped is not generate and calls == [("decorated", generate)]
    assert wrapped(job(steps=50, size=1024, images=4), None, None) == "ran r"
    assert calls[-1] == ("call", gpu_seconds(job(steps=50, size=1024, images=4)))


def test_the_duration_grows_with_steps_pixels_and_images_within_bounds() -> None:
    base = gpu_seconds(job(20, 1024, 1))
    assert MIN_SECONDS < base < gpu_seconds(job(40, 1024, 1)) < gpu_seconds(job(50, 1024, 4)) < MAX_SECONDS
    assert gpu_seconds(job(20, 1280, 1)) > base and gpu_seconds(job(20, 1024, 2)) > base
    assert gpu_seconds(job(1, 64, 1)) == MIN_SECONDS and gpu_seconds(job(100, 2048, 8)) == MAX_SECONDS


def test_the_loaded_model_goes_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_model wraps the real pipeline's generate on ZeroGPU (the stub runs it on the CPU)."""
    import threading

    from pipeline.config import Settings
    from pipeline.model import load_model

    calls = stub_spaces(monkeypatch, zero_gpu=True)
    model = load_model(Settings(), warmup=False)
    result = model.generate(job(steps=2, size=64), threading.Event(), lambda *_: None)
    assert len(result.images) == 1 and calls[-1] == ("call", MIN_SECONDS)


def test_the_readme_front_matter_makes_a_gradio_space_on_the_pinned_version() -> None:
    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    assert text.startswith("---\n")
    front = dict(line.split(": ", 1) for line in text.split("---\n")[1].strip().splitlines())
    pinned = re.search(r"^gradio==(\S+)$", (root / "requirements.txt").read_text(), re.M)
    assert pinned and front["sdk"] == "gradio" and front["sdk_version"] == pinned.group(1)
    assert front["app_file"] == "app.py" and (root / front["app_file"]).exists()
    assert front["title"] and front["emoji"] and 0 < len(front["short_description"]) <= 60

"""The launched app with its model in a process of its own: a lean server process, and healing when
that process is killed mid-job (the process side on its own is in ``tests/unit/test_model_process.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import ROOT, process_exited, running_app, wait_for

WAIT = 60.0


def test_the_server_process_does_not_import_torch_in_process_mode(tmp_path: Path) -> None:
    """The server stays lean: torch and diffusers load in the model process only."""
    script = textwrap.dedent(
        f"""
        import sys
        import app
        from pipeline.config import load_settings
        settings = load_settings(["--output-dir", {str(tmp_path)!r}], environ={{}})
        side, profile = app.start_model_side(settings)
        try:
            assert type(side).__name__ == "ProcessSide", side
            assert profile.pipeline_class == "StableDiffusionPipeline", profile
            loaded = sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules)
            assert not loaded, loaded
        finally:
            side.shutdown(30)
        print("lean")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "lean", (out.stdout, out.stderr[-3000:])


def test_the_running_app_heals_when_its_model_process_is_killed_mid_job(tmp_path: Path) -> None:
    """The must-show: kill -9 the default model's process during a job. That job gets a clear
    error at once, /health says recovering, a job sent meanwhile waits in line and gets its image."""
    import httpx
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    with running_app(tmp_path, "--max-pixel-steps", str(256 * 256 * 100)) as (url, _demo, adapter):  # a long job
        assert adapter.health()["model_side"] == "ready"
        first = adapter.side.pid
        client = Client(url, verbose=False, download_files=str(tmp_path / "client"))
        params = dict(
            prompt="a red circle", randomize_seed=False, width=256, height=256, guidance_scale=7.5, num_images=1
        )
        doomed = client.submit(api_name="/generate", seed=1, num_inference_steps=100, **params)
        wait_for(
            lambda: adapter.inference_in_progress and adapter.metrics.denoise_steps._value.get() > 0,
            "the job is denoising in the model process",
            timeout=WAIT,
        )
        seen: list[str] = []
        watching = threading.Event()

        def watch_health() -> None:
            while not watching.is_set():
                seen.append(httpx.get(url + "health", timeout=5).json()["status"])

        watcher = threading.Thread(target=watch_health, daemon=True)
        watcher.start()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(AppError, match=r"model process stopped while running your job \(request id "):
            doomed.result(timeout=WAIT)
        waiting = client.submit(api_name="/generate", seed=2, num_inference_steps=4, **params)
        gallery, info = waiting.result(timeout=2 * WAIT)  # in line until the new process is up
        watching.set()
        watcher.join(timeout=10)
        with Image.open(gallery[0]["image"]) as image:
            assert image.size == (256, 256)
        assert info["seed"] == 2
        assert "recovering" in seen, seen
        health = httpx.get(url + "health", timeout=5).json()
        assert health["status"] == "ok" and health["model_side"] == "ready" and health["model_restarts"] == 1
        assert adapter.side.pid != first and process_exited(first)

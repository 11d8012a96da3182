"""The real model in a process of its own: what a step and a preview cost on the socket, a lean server
process, and healing when that process is killed mid-job (the process side with the fake model is in
``tests/unit/test_model_process.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from pipeline.engine.hosting.process import ProcessSide
from pipeline.protocol import EncodedPreview, InferenceJob, InferenceResult, StepEvent, StopSignal
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


def test_a_step_crosses_as_a_few_bytes_and_a_preview_as_a_small_jpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded model at 512 px in its own process: every message the server reads is measured as
    it comes off the socket. With previews off a step is a few hundred bytes (no latent, no picture);
    with previews on, a preview is a JPEG of at most 256 px (not a 512 px picture: 768 KB raw)."""
    from multiprocessing.connection import Connection

    from pipeline.config import Settings
    from pipeline.engine.hosting.process import SettingsLoader
    from pipeline.protocol import PREVIEW_MAX_SIDE

    sizes: list[int] = []
    original = Connection._recv_bytes

    def measured(self: Any, maxsize: Any = None) -> Any:
        buffer = original(self, maxsize)
        sizes.append(len(buffer.getbuffer()))
        return buffer

    monkeypatch.setattr(Connection, "_recv_bytes", measured)
    side = ProcessSide(SettingsLoader(Settings(device="cpu")), ready_timeout=WAIT)
    try:
        for every in (0, 1):
            sizes.clear()
            job = InferenceJob(f"p{every}", ("a red circle",), ("",), (3,), 512, 512, 3, 4.0, preview_every=every)
            events = list(side.stream(job, StopSignal()))
            steps = [e for e in events if isinstance(e, StepEvent)]
            assert len(steps) == 3 and isinstance(events[-1], InferenceResult)
            step_messages = sorted(sizes)[:-1]  # every message but the largest: the result's PNG-sized images
            if every == 0:
                assert not any(s.previews for s in steps)
                assert max(step_messages) < 1024, sizes  # a step: its numbers only
            else:
                shown = [s.preview(0) for s in steps[:-1]]  # none on the last step
                assert all(isinstance(p, EncodedPreview) for p in shown)
                assert all(max(p.size) <= PREVIEW_MAX_SIDE and p.image().size == p.size for p in shown)
                assert max(step_messages) < 64 * 1024, sizes  # a small JPEG, not a 512 px picture
    finally:
        side.shutdown(timeout=WAIT)

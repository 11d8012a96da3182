"""The launched app on ZeroGPU (the stand-in ``tests/stubs/spaces``): each user's job runs in the GPU
process in that user's context (the ZeroGPU side on its own is in ``tests/unit/test_zerogpu.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import SPACES_STUBS, app_process, raw_request, spaces_calls, wait_for
from tests.loras import loras_of


def test_the_app_on_zerogpu_serves_each_user_in_their_own_context(tmp_path: Path) -> None:
    """The launched app with the stand-in: it starts (no warm-up crash), draws the requested size,
    streams progress, charges the caller's request, and Stop ends the GPU process's job."""
    from gradio_client import Client
    from PIL import Image

    log = tmp_path / "spaces.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join([str(SPACES_STUBS), os.environ.get("PYTHONPATH", "")]),
        "SPACES_ZERO_GPU": "true",
        "SPACES_STUB_LOG": str(log),
    }
    ink = loras_of("default")["a"]  # and a LoRA: the job's choice crosses into the GPU process
    with app_process(tmp_path, "--max-batch-size", "1", "--lora", f"ink={ink}", env=env) as (url, proc, server_log):
        assert spaces_calls(log) == [], "a GPU call outside any request (the warm-up)"
        client = Client(url, verbose=False, download_files=str(tmp_path / "dl"))
        submitted = client.submit(
            **raw_request(width=64, height=96, num_inference_steps=6, seed=3), api_name="/generate"
        )
        gallery, info = submitted.result(timeout=120)
        assert info["status"] == "done" and info["seeds"] == [3]
        with Image.open(gallery[0]["image"]) as image:
            assert image.size == (64, 96)
        [call] = spaces_calls(log)
        assert call["saw_request"] and call["session_hash"], call  # the user's quota, not nobody's
        assert call["pid_child"] not in (proc.pid, None) and call["yields"] >= 7 and call["error"] is None
        assert any(o[1].get("status") == "running" for o in submitted.outputs())

        long = client.submit(**raw_request(num_inference_steps=100, seed=4), api_name="/generate")
        wait_for(lambda: any(o[1].get("status") == "running" for o in long.outputs()), "the long job runs", 60)
        long.cancel()
        wait_for(lambda: len(spaces_calls(log)) == 2, "the GPU call returned after the cancel", 60)
        stopped = spaces_calls(log)[-1]
        assert stopped["stopped"] and stopped["yields"] < 100, stopped
        plain, after = client.predict(**raw_request(num_inference_steps=2, seed=5), api_name="/generate")
        assert after["status"] == "done"
        styled, styled_info = client.predict(
            **raw_request(num_inference_steps=2, seed=5, lora="ink"), api_name="/generate"
        )
        assert styled_info["lora"] == "ink" and after["lora"] == "none"
        import numpy as np

        with Image.open(plain[0]["image"]) as a, Image.open(styled[0]["image"]) as b:
            assert np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean() > 0.25  # it applied
    output = server_log.read_text()
    assert "cannot pickle" not in output and "Traceback" not in output, output[-3000:]

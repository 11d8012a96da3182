"""The embedded model loads from disk through diffusers' own ``from_pretrained``, offline, in a fresh
interpreter that has none of the app's code on its path."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.default_model import ensure_default_model
from tests.helpers import ROOT


def test_embedded_model_loads_from_disk_through_from_pretrained_offline() -> None:
    path = ensure_default_model()
    index = json.loads((path / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    assert index["scheduler"][1] == "EulerDiscreteScheduler"
    code = (
        "import sys, torch; from diffusers import DiffusionPipeline; "
        "import huggingface_hub.constants as c; assert c.HF_HUB_OFFLINE; "
        f"p = DiffusionPipeline.from_pretrained({str(path)!r}); p.set_progress_bar_config(disable=True); "
        "im = p('a red circle', num_inference_steps=2, width=64, height=64, generator=torch.Generator().manual_seed(0)).images[0]; "
        "print(type(p).__name__, p.vae_scale_factor, im.size)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["StableDiffusionPipeline", "4", "(64,", "64)"]

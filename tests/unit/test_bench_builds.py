"""The lent GPU's random-weight builds (``bench/sd15.py``: SD 1.5, and SDXL since issue 52) run only on a GPU at
full size; here their code runs at toy widths, so a mistake shows before a device's minutes are spent on it:
each folder loads through ``from_pretrained`` as its family's pipeline, and a second build is skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import sd15

TOY_TEXT = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 2,
            "projection_dim": 32}  # fmt: skip
TOY_VAE = {"block_out_channels": (8, 8, 8, 8), "norm_num_groups": 8}


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_the_gpu_builds_write_a_pipeline_that_loads(family: str, tmp_path: Path, monkeypatch: Any) -> None:
    from diffusers import DiffusionPipeline

    monkeypatch.setattr(sd15, "TEXT", {**sd15.TEXT, **TOY_TEXT})
    monkeypatch.setattr(sd15, "VAE", {**sd15.VAE, **TOY_VAE})
    monkeypatch.setattr(sd15, "UNET", {**sd15.UNET, "block_out_channels": (32, 32, 32, 32), "norm_num_groups": 8,
                                       "attention_head_dim": 2, "cross_attention_dim": 32})  # fmt: skip
    monkeypatch.setattr(sd15, "SDXL_TEXT_2", {**sd15.SDXL_TEXT_2, **TOY_TEXT})
    monkeypatch.setattr(sd15, "SDXL_UNET", {**sd15.SDXL_UNET, "block_out_channels": (32, 64, 64), "norm_num_groups": 8,
                                            "transformer_layers_per_block": (1, 1, 1), "attention_head_dim": (2, 4, 4),
                                            "cross_attention_dim": 64, "projection_class_embeddings_input_dim": 32 + 6 * 256})  # fmt: skip
    build = sd15.build_sdxl if family == "sdxl" else sd15.build
    out = build(tmp_path / family, "float32")
    pipe = DiffusionPipeline.from_pretrained(out)
    assert type(pipe).__name__ == ("StableDiffusionXLPipeline" if family == "sdxl" else "StableDiffusionPipeline")
    image = pipe("a red circle", num_inference_steps=1, height=64, width=64, output_type="np").images[0]
    assert image.shape == (64, 64, 3)  # the architecture runs end to end (its text, time and size conditioning)
    stamp = (out / "sd15_random_build.json").stat().st_mtime_ns
    assert build(tmp_path / family, "float32") == out and (out / "sd15_random_build.json").stat().st_mtime_ns == stamp

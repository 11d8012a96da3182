"""A full-size Stable Diffusion 1.5 architecture with random weights, for the GPU benchmark.

No download: the UNet (860M parameters), VAE and CLIP ViT-L/14 text encoder are built from the
published SD 1.5 configuration with seeded random weights, the tokenizer is the embedded default
model's (its vocabulary fits CLIP's 49408 embeddings), and the folder is written with
``save_pretrained`` so the app loads it through ``from_pretrained`` like any model:

    python -m bench.sd15 --out /tmp/sd15 [--dtype float16]
    python app.py --model /tmp/sd15 --device cuda

The pictures are noise; the compute per step, the memory and the latency are SD 1.5's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

# stable-diffusion-v1-5's unet/vae/text_encoder config.json, the fields that shape the compute.
UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=768,
    attention_head_dim=8,
    norm_num_groups=32,
)
VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    layers_per_block=2,
    sample_size=512,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
)
TEXT: dict[str, Any] = dict(
    vocab_size=49408,
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_position_embeddings=77,
    hidden_act="quick_gelu",
    projection_dim=768,
)
_STAMP = "sd15_random_build.json"
# stable-diffusion-xl-base-1.0's UNet and second text encoder (OpenCLIP bigG), the fields that shape the compute
# (``--family sdxl``: issue 52's second model on a lent GPU, 2.6B UNet parameters).
SDXL_UNET: dict[str, Any] = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,
    attention_head_dim=(5, 10, 20),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    norm_num_groups=32,
)
SDXL_TEXT_2: dict[str, Any] = dict(
    vocab_size=49408,
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=20,
    max_position_embeddings=77,
    hidden_act="gelu",
    projection_dim=1280,
)


def _built(out: Path, stamp: dict[str, Any]) -> bool:
    """Whether ``out`` holds a build with these settings already."""
    try:
        return bool(json.loads((out / _STAMP).read_text()) == json.loads(json.dumps(stamp)))
    except (OSError, ValueError):
        return False


def _clip_tokenizer(seed: int) -> tuple[Any, dict[str, Any]]:
    """The embedded model's CLIP tokenizer and its special ids (the torch seed set for the weights that follow)."""
    import torch
    from transformers import CLIPTokenizer

    from pipeline.default_model import ensure_default_model

    torch.manual_seed(seed)
    tokenizer = CLIPTokenizer.from_pretrained(ensure_default_model() / "tokenizer")
    vocab = tokenizer.get_vocab()
    ends = vocab["<|endoftext|>"]
    return tokenizer, {"bos_token_id": vocab["<|startoftext|>"], "eos_token_id": ends, "pad_token_id": ends}


def build(out: Path, dtype: str = "float16", seed: int = 0) -> Path:
    """Write the pipeline to ``out`` (skipped if a build with the same settings is already there)."""
    stamp = {"seed": seed, "dtype": dtype, "unet": UNET["block_out_channels"]}
    if _built(out, stamp):
        return out
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    t0 = time.time()
    tokenizer, ids = _clip_tokenizer(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(**TEXT, **ids))
    unet: Any = UNet2DConditionModel(**UNET)
    vae = AutoencoderKL(**VAE)
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        skip_prk_steps=True,
        steps_offset=1,
        set_alpha_to_one=False,
    )
    pipe: Any = StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.to(dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    (out / _STAMP).write_text(json.dumps(stamp))
    print(
        f"built SD 1.5 architecture ({sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M UNet parameters) "
        f"in {time.time() - t0:.1f} s",
        flush=True,
    )
    return out


def build_sdxl(out: Path, dtype: str = "float16", seed: int = 0) -> Path:
    """The SDXL base architecture (its UNet, both text encoders, its VAE) with seeded random weights, written
    to ``out`` as ``build`` writes SD 1.5's (skipped if the same build is there)."""
    stamp = {"seed": seed, "dtype": dtype, "family": "sdxl", "unet": SDXL_UNET["block_out_channels"]}
    if _built(out, stamp):
        return out
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    t0 = time.time()
    tokenizer, ids = _clip_tokenizer(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(**TEXT, **ids))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**SDXL_TEXT_2, **ids))
    unet: Any = UNet2DConditionModel(**SDXL_UNET)
    vae = AutoencoderKL(**{**VAE, "sample_size": 1024}, scaling_factor=0.13025)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       num_train_timesteps=1000, steps_offset=1, timestep_spacing="leading")  # fmt: skip
    pipe: Any = StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                          tokenizer=tokenizer, tokenizer_2=tokenizer, unet=unet, scheduler=scheduler)  # fmt: skip
    pipe.to(dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    (out / _STAMP).write_text(json.dumps(stamp))
    print(f"built SDXL architecture ({sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M UNet parameters) "
          f"in {time.time() - t0:.1f} s", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/sd15-random"))
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--family", default="sd15", choices=["sd15", "sdxl"], help="sdxl: the SDXL base architecture")
    args = parser.parse_args(argv)
    print(build_sdxl(args.out, args.dtype) if args.family == "sdxl" else build(args.out, args.dtype))


if __name__ == "__main__":
    main()

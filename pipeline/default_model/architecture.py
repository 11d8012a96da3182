"""The default model's architecture: a tiny Stable-Diffusion-family pipeline, seeded weights.

``python -m pipeline.default_model.train`` trains this architecture on coloured shapes drawn by
``pipeline.default_model.shapes`` and writes ``assets/default-model/`` (safetensors, 5.4 MB).

The architecture: a small UNet (with the pooled prompt added to its time embedding), a VAE with
three blocks (it downsamples by 4: 64 px pictures are 16x16x4 latents), a tiny CLIP text encoder
with a byte-level BPE tokenizer learned here from a fixed word list, and the stateful Euler
scheduler (v-prediction, zero terminal SNR, trailing timesteps).

    python -m pipeline.default_model.architecture --untrained --out DIR   # seeded random weights

Random weights draw noise; they remain useful where only the plumbing matters (fast, deterministic
builds in tests).
"""

from __future__ import annotations

import argparse
import collections
import logging
from pathlib import Path
from typing import Any

from .folder import save_model

log = logging.getLogger(__name__)

BUILD_SEED = 20261130
# Changing the architecture or the tokenizer here: bump ``folder.BUILD_VERSION``, so stale builds are rebuilt.

# Words the tokenizer learns merges from: what people type into a text-to-image demo.
CORPUS = [
    "a",
    "an",
    "the",
    "of",
    "on",
    "in",
    "at",
    "with",
    "and",
    "or",
    "by",
    "from",
    "to",
    "for",
    "under",
    "over",
    "above",
    "below",
    "behind",
    "near",
    "beside",
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "gray",
    "grey",
    "gold",
    "silver",
    "cyan",
    "magenta",
    "circle",
    "square",
    "triangle",
    "star",
    "heart",
    "hexagon",
    "diamond",
    "cross",
    "ring",
    "line",
    "dot",
    "shape",
    "shapes",
    "small",
    "large",
    "big",
    "tiny",
    "huge",
    "top",
    "bottom",
    "left",
    "right",
    "center",
    "middle",
    "corner",
    "background",
    "foreground",
    "photo",
    "photograph",
    "painting",
    "drawing",
    "sketch",
    "illustration",
    "render",
    "portrait",
    "landscape",
    "closeup",
    "cat",
    "dog",
    "bird",
    "horse",
    "fish",
    "tree",
    "flower",
    "forest",
    "mountain",
    "river",
    "lake",
    "sea",
    "ocean",
    "beach",
    "sky",
    "cloud",
    "sun",
    "moon",
    "night",
    "day",
    "city",
    "street",
    "house",
    "castle",
    "car",
    "boat",
    "robot",
    "astronaut",
    "dragon",
    "person",
    "woman",
    "man",
    "beautiful",
    "detailed",
    "realistic",
    "cinematic",
    "lighting",
    "sharp",
    "focus",
    "high",
    "quality",
    "style",
    "art",
    "digital",
    "watercolor",
    "oil",
    "pencil",
    "anime",
    "cartoon",
    "fantasy",
    "futuristic",
    "vintage",
    "colorful",
    "dark",
    "bright",
    "soft",
    "blurry",
    "ugly",
    "deformed",
    "low",
    "resolution",
    "noisy",
    "text",
    "watermark",
]
_NUM_MERGES = 400

# v-prediction on a schedule rescaled to zero terminal SNR, sampled with trailing timesteps (Lin et
# al., "Common Diffusion Noise Schedules and Sample Steps are Flawed"): with SD's usual schedule the
# last noise level still holds some of the picture's mean colour, so a model cannot choose its
# background colour freely -- and the background colour is most of what these pictures are.
SCHEDULER_CONFIG = dict(
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    num_train_timesteps=1000,
    prediction_type="v_prediction",
    rescale_betas_zero_snr=True,
    timestep_spacing="trailing",
    steps_offset=1,
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def learn_merges(split: dict[str, tuple[str, ...]], num_merges: int) -> list[tuple[str, str]]:
    """BPE merges over words already split into symbols; deterministic (ties break lexicographically)."""
    split = dict(split)
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for symbols in split.values():
            pairs.update(zip(symbols, symbols[1:]))
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w, symbols in split.items():
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            split[w] = tuple(out)
    return merges


def learn_bpe(words: list[str], num_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn CLIP-style BPE merges from ``words``; deterministic (ties break lexicographically)."""
    byte_chars = list(bytes_to_unicode().values())
    words_split = {w: tuple(w[:-1]) + (w[-1] + "</w>",) for w in sorted(set(words))}
    merges = learn_merges(words_split, num_merges)
    vocab_list = byte_chars + [c + "</w>" for c in byte_chars] + [a + b for a, b in merges]
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab_list)}, merges


def build_pipeline(seed: int = BUILD_SEED) -> Any:  # a StableDiffusionPipeline
    """Build the tiny pipeline in memory with seeded random weights."""
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = learn_bpe(CORPUS, _NUM_MERGES)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges)  # type: ignore[arg-type]  # it takes (a, b) pairs too
    tokenizer.model_max_length = 77

    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
            projection_dim=64,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=8,
        norm_num_groups=8,
        # The pooled prompt also joins the time embedding, so every block hears it: the picture's
        # colours are global, and cross-attention alone reaches only the lower-resolution blocks.
        addition_embed_type="text",
        addition_embed_type_num_heads=4,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),  # downsamples by 4: 64 px pictures are 16x16 latents
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
    )
    scheduler = EulerDiscreteScheduler(**SCHEDULER_CONFIG)
    return StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_untrained(path: Path, seed: int = BUILD_SEED) -> Path:
    """Write the architecture with seeded random weights to ``path``."""
    log.info("building the untrained default architecture into %s", path)
    return save_model(build_pipeline(seed), path, {"trained": False, "seed": seed})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--untrained",
        action="store_true",
        required=True,
        help="seeded random weights (the trained model: python -m pipeline.default_model.train)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    print(build_untrained(args.out))


if __name__ == "__main__":
    main()

"""Tiny random-weight pipelines of every model family the app may be pointed at, built in seconds.

Each family is built from configs (nothing is downloaded: the tokenizers are learned or written
here) with seeded random weights, tiny widths and few layers -- but with the real model's
structure wherever the app reads it: the VAE downsamples by 8 (Sana's DC-AE by 32), latents have
the real channel count, the denoiser's ``sample_size`` gives the real default size, SD3's
transformer and FLUX's latent packing patchify by 2, the schedulers carry the real model cards'
configs, and the tokenizers have the real maximum lengths. ``build_family`` writes a folder with
``save_pretrained`` (safetensors) that ``DiffusionPipeline.from_pretrained`` loads like any
downloaded model::

    from tests.families import FAMILIES, build_family, built_family
    path = build_family("sdxl", Path("/tmp/sdxl"))   # -> /tmp/sdxl (model_index.json, unet/, ...)
    path = built_family("flux-dev")                  # built once per process into a temp folder

    python -m tests.families OUT_DIR [FAMILY ...]     # build folders from the command line

The pictures are noise; the plumbing (shapes, schedulers, tokenizers, call arguments) is real.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.default_model.architecture import _CORPUS, learn_bpe

SEED = 20260101

# The words every tokenizer here learns from: the default model's text-to-image word list.
_WORDS: list[str] = list(_CORPUS)
_CLIP_MERGES = 400
_GEMMA_MERGES = 300
# Characters every T5/Gemma tokenizer can spell any word with (besides their unknown/byte fallback).
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()[]/&+*=_#%@<>"


# --------------------------------------------------------------------------------------------
# Tokenizers (made locally).


def make_clip_tokenizer(pad_token: str = "<|endoftext|>") -> Any:
    """A byte-level BPE ``CLIPTokenizer`` (model_max_length 77) learned from the word list.

    ``pad_token="!"`` (id 0) is OpenCLIP's choice (SD 2.x, SDXL's and SD3's second tokenizer);
    OpenAI CLIP (SD 1.x, the first tokenizer of SDXL/SD3/FLUX) pads with ``<|endoftext|>``.
    """
    from transformers import CLIPTokenizer

    vocab, merges = learn_bpe(_WORDS, _CLIP_MERGES)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token)
    tokenizer.model_max_length = 77
    return tokenizer


def make_t5_tokenizer(model_max_length: int = 512) -> Any:
    """A Unigram ``T5Tokenizer``: <pad>=0, </s>=1, <unk>=2, whole words, then single characters."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    seen = {p for p, _ in pieces}
    for word in sorted(set(_WORDS)):
        for piece in ("\u2581" + word, word):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -4.0 - 0.01 * len(pieces)))
    for ch in _CHARS:
        for piece in (ch, "\u2581" + ch):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -12.0))
    tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=model_max_length)
    return tokenizer


def _learn_sentencepiece_bpe(words: list[str], num_merges: int) -> list[tuple[str, str]]:
    """BPE merges over "▁word" strings (SentencePiece style); ties break lexicographically."""
    from pipeline.default_model.architecture import learn_merges

    return learn_merges({w: tuple("\u2581" + w) for w in sorted(set(words))}, num_merges)


def make_gemma_tokenizer() -> Any:
    """A byte-fallback BPE ``GemmaTokenizer`` like Gemma 2's (right padding, as Sana sets it)."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    vocab_list = specials + [f"<0x{b:02X}>" for b in range(256)]
    vocab_list += sorted(set(_CHARS) | {"\u2581"} | set("".join(_WORDS)))
    merges = _learn_sentencepiece_bpe(_WORDS, _GEMMA_MERGES)
    for a, b in merges:
        if a + b not in vocab_list:
            vocab_list.append(a + b)
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=8192)  # pairs
    tokenizer.padding_side = "right"
    return tokenizer


# --------------------------------------------------------------------------------------------
# Text encoders.


def _clip_text(tokenizer: Any, hidden: int, projection: int, *, act: str, with_projection: bool, seed: int) -> Any:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    vocab = tokenizer.get_vocab()
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        hidden_act=act,
        projection_dim=projection,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def _t5_encoder(tokenizer: Any, d_model: int, seed: int) -> Any:
    import torch
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=d_model * 2,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",  # T5 v1.1 (the XXL encoder every family here uses)
        is_encoder_decoder=False,
        use_cache=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    return T5EncoderModel(config)


# --------------------------------------------------------------------------------------------
# VAEs: four blocks (8x) with tiny channels.


def _vae_kl(latent_channels: int, sample_size: int, seed: int, **extra: Any) -> Any:
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),  # four blocks: downsamples by 8 like every real KL VAE
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=sample_size,
        **extra,
    )


# SD 1.5's sd-vae-ft-mse/ema and PixArt-alpha's: scaling 0.18215.
def _vae_sd(sample_size: int, seed: int) -> Any:
    return _vae_kl(4, sample_size, seed, scaling_factor=0.18215)


# SDXL's VAE (also PixArt-Sigma's): scaling 0.13025, upcast in fp16.
def _vae_sdxl(seed: int) -> Any:
    return _vae_kl(4, 1024, seed, scaling_factor=0.13025, force_upcast=True)


# --------------------------------------------------------------------------------------------
# Schedulers, as in the real model cards' scheduler_config.json.

_SD_BETAS = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)


def _scheduler(kind: str) -> Any:
    from diffusers import (
        DDIMScheduler,
        DPMSolverMultistepScheduler,
        EulerDiscreteScheduler,
        FlowMatchEulerDiscreteScheduler,
        PNDMScheduler,
    )

    if kind == "sd1":  # stable-diffusion-v1-5
        return PNDMScheduler(**_SD_BETAS, skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
    if kind == "sd2-v":  # stable-diffusion-2-1 (768, v-prediction)
        return DDIMScheduler(
            **_SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1, prediction_type="v_prediction"
        )
    if kind == "sdxl":  # stable-diffusion-xl-base-1.0
        return EulerDiscreteScheduler(
            **_SD_BETAS,
            steps_offset=1,
            timestep_spacing="leading",
            interpolation_type="linear",
            use_karras_sigmas=False,
            prediction_type="epsilon",
        )
    if kind == "sd3":  # stable-diffusion-3-medium-diffusers
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    flux = dict(
        num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15
    )
    if kind == "flux-schnell":
        return FlowMatchEulerDiscreteScheduler(**flux, shift=1.0, use_dynamic_shifting=False)
    if kind == "flux-dev":
        return FlowMatchEulerDiscreteScheduler(**flux, shift=3.0, use_dynamic_shifting=True)
    if kind == "pixart":  # PixArt-XL-2-1024-MS, PixArt-Sigma-XL-2-1024-MS (DPMSolverMultistepScheduler())
        return DPMSolverMultistepScheduler(
            num_train_timesteps=1000,
            beta_start=0.0001,
            beta_end=0.02,
            beta_schedule="linear",
            solver_order=2,
            prediction_type="epsilon",
            algorithm_type="dpmsolver++",
            solver_type="midpoint",
            lower_order_final=True,
            timestep_spacing="linspace",
            steps_offset=0,
        )
    if kind == "sana":  # Sana_1600M_1024px_diffusers: flow DPM-Solver, shift 3
        return DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
    raise KeyError(kind)


# --------------------------------------------------------------------------------------------
# Families.


def _build_sd1() -> Any:
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer()
    text_encoder = _clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)
    torch.manual_seed(SEED + 1)
    unet = UNet2DConditionModel(
        sample_size=64,  # x8 = 512 px
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 16, 32, 32),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return StableDiffusionPipeline(
        vae=_vae_sd(512, SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler("sd1"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _build_sd2_v() -> Any:
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer(pad_token="!")  # OpenCLIP ViT-H pads with "!"
    text_encoder = _clip_text(tokenizer, 48, 32, act="gelu", with_projection=False, seed=SEED)
    torch.manual_seed(SEED + 1)
    unet = UNet2DConditionModel(
        sample_size=96,  # x8 = 768 px
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 16, 32, 32),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=48,
        attention_head_dim=(2, 2, 4, 4),  # SD 2.x: (5, 10, 20, 20) heads
        use_linear_projection=True,
        upcast_attention=True,
        norm_num_groups=8,
    )
    return StableDiffusionPipeline(
        vae=_vae_sd(768, SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler("sd2-v"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _build_sdxl() -> Any:
    import torch
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer(pad_token="!")
    text_encoder = _clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)  # CLIP ViT-L
    text_encoder_2 = _clip_text(tokenizer_2, 64, 64, act="gelu", with_projection=True, seed=SEED + 3)  # bigG
    addition_time_embed_dim = 8  # real: 256
    torch.manual_seed(SEED + 1)
    unet = UNet2DConditionModel(
        sample_size=128,  # x8 = 1024 px
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 1, 2),  # real: (1, 2, 10)
        attention_head_dim=(2, 4, 4),  # real: (5, 10, 20)
        use_linear_projection=True,
        cross_attention_dim=32 + 64,  # both encoders' penultimate hidden states, concatenated
        addition_embed_type="text_time",
        addition_embed_type_num_heads=64,
        addition_time_embed_dim=addition_time_embed_dim,
        projection_class_embeddings_input_dim=6 * addition_time_embed_dim + 64,  # 6 time ids + pooled bigG
        norm_num_groups=8,
    )
    return StableDiffusionXLPipeline(
        vae=_vae_sdxl(SEED + 2),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=_scheduler("sdxl"),
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )


def _build_sd3() -> Any:
    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer(pad_token="!")
    tokenizer_3 = make_t5_tokenizer(512)
    # CLIP-L (hidden 768 -> 32) and CLIP-G (1280 -> 64) both with projection; T5-XXL (4096 -> 128).
    text_encoder = _clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=True, seed=SEED)
    text_encoder_2 = _clip_text(tokenizer_2, 64, 64, act="gelu", with_projection=True, seed=SEED + 3)
    text_encoder_3 = _t5_encoder(tokenizer_3, 128, seed=SEED + 4)
    torch.manual_seed(SEED + 1)
    transformer = SD3Transformer2DModel(
        sample_size=128,  # x8 = 1024 px
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=128,  # T5's d_model (CLIP-L + CLIP-G = 96 is zero-padded up to it)
        caption_projection_dim=32,  # = heads * head dim
        pooled_projection_dim=32 + 64,  # CLIP-L + CLIP-G text_embeds
        pos_embed_max_size=192,
    )
    vae = _vae_kl(
        16, 1024, SEED + 2, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=_scheduler("sd3"),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )


def _build_flux(*, guidance_embeds: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import FluxPipeline, FluxTransformer2DModel

        tokenizer = make_clip_tokenizer()
        tokenizer_2 = make_t5_tokenizer(512)
        text_encoder = _clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)
        text_encoder_2 = _t5_encoder(tokenizer_2, 64, seed=SEED + 4)
        torch.manual_seed(SEED + 1)
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,  # 16 latent channels packed 2x2
            num_layers=1,  # real: 19
            num_single_layers=2,  # real: 38
            attention_head_dim=16,  # real: 128
            num_attention_heads=2,  # real: 24
            joint_attention_dim=64,  # T5's d_model
            pooled_projection_dim=32,  # CLIP-L's pooled output
            guidance_embeds=guidance_embeds,
            axes_dims_rope=(4, 6, 6),  # real: (16, 56, 56); sums to the head dim
        )
        vae = _vae_kl(
            16,
            1024,
            SEED + 2,
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        )
        return FluxPipeline(
            scheduler=_scheduler("flux-dev" if guidance_embeds else "flux-schnell"),
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            transformer=transformer,
        )

    return build


def _build_pixart(*, sigma: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import PixArtAlphaPipeline, PixArtSigmaPipeline, PixArtTransformer2DModel

        tokenizer = make_t5_tokenizer(512)
        text_encoder = _t5_encoder(tokenizer, 64, seed=SEED)
        torch.manual_seed(SEED + 1)
        transformer = PixArtTransformer2DModel(
            sample_size=128,  # x8 = 1024 px
            num_layers=2,  # real: 28
            patch_size=2,
            attention_head_dim=8,  # real: 72
            num_attention_heads=3,  # real: 16; the width must divide by 3 (alpha's size conditions)
            in_channels=4,
            out_channels=8,  # learned sigma
            cross_attention_dim=24,  # = heads * head dim (real: 1152)
            caption_channels=64,  # T5's d_model (real: 4096)
            attention_bias=True,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
            interpolation_scale=2,  # the 1024 px checkpoints'
            use_additional_conditions=not sigma,  # alpha-1024 embeds resolution and aspect ratio
        )
        cls = PixArtSigmaPipeline if sigma else PixArtAlphaPipeline
        vae = _vae_sdxl(SEED + 2) if sigma else _vae_sd(1024, SEED + 2)
        return cls(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            transformer=transformer,
            scheduler=_scheduler("pixart"),
        )

    return build


def _build_sana() -> Any:
    import torch
    from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    tokenizer = make_gemma_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = Gemma2Model(
        Gemma2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,  # real (gemma-2-2b-it): 2304
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=8192,
            query_pre_attn_scalar=16,
            sliding_window=4096,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )
    torch.manual_seed(SEED + 1)
    transformer = SanaTransformer2DModel(
        in_channels=32,
        out_channels=32,
        num_attention_heads=2,  # real: 70
        attention_head_dim=16,  # real: 32
        num_layers=2,  # real: 20
        num_cross_attention_heads=2,
        cross_attention_head_dim=16,
        cross_attention_dim=32,
        caption_channels=32,  # Gemma 2's hidden size
        mlp_ratio=2.5,
        attention_bias=False,
        sample_size=32,  # x32 = 1024 px
        patch_size=1,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        interpolation_scale=None,
    )
    torch.manual_seed(SEED + 2)
    vae = AutoencoderDC(  # dc-ae-f32c32-sana: six stages, 32x compression, 32 latent channels
        in_channels=3,
        latent_channels=32,
        attention_head_dim=8,
        encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        encoder_block_out_channels=(8, 8, 16, 16, 32, 32),
        decoder_block_out_channels=(8, 8, 16, 16, 32, 32),
        encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
        decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
        encoder_layers_per_block=(1, 1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1, 1),
        downsample_block_type="conv",
        upsample_block_type="interpolate",
        decoder_norm_types="rms_norm",
        decoder_act_fns="silu",
        scaling_factor=0.41407,
    )
    return SanaPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=_scheduler("sana")
    )


@dataclass(frozen=True)
class FamilySpec:
    """What a family's built folder is, as the tests check it."""

    name: str
    pipeline_class: str  # model_index.json's _class_name
    build: Callable[[], Any] = field(repr=False)  # the pipeline, in memory
    vae_scale_factor: int
    latent_channels: int  # the VAE's (FLUX's transformer takes them packed 2x2: 4x as many)
    default_size: int  # the real model's default width and height
    size_multiple: int  # sizes must be multiples of this (vae_scale_factor * patch size)
    scheduler_class: str
    prediction_type: str  # "epsilon", "v_prediction" or "flow"
    tokenizers: dict[str, int]  # component -> model_max_length
    max_sequence_length: int | None  # the __call__ default for the T5/Gemma prompt, where it has one


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        FamilySpec(
            name="sd1",
            pipeline_class="StableDiffusionPipeline",
            build=_build_sd1,
            vae_scale_factor=8,
            latent_channels=4,
            default_size=512,
            size_multiple=8,
            scheduler_class="PNDMScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sd2-v",
            pipeline_class="StableDiffusionPipeline",
            build=_build_sd2_v,
            vae_scale_factor=8,
            latent_channels=4,
            default_size=768,
            size_multiple=8,
            scheduler_class="DDIMScheduler",
            prediction_type="v_prediction",
            tokenizers={"tokenizer": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sdxl",
            pipeline_class="StableDiffusionXLPipeline",
            build=_build_sdxl,
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=8,
            scheduler_class="EulerDiscreteScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 77, "tokenizer_2": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sd3",
            pipeline_class="StableDiffusion3Pipeline",
            build=_build_sd3,
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 77, "tokenizer_3": 512},
            max_sequence_length=256,
        ),
        FamilySpec(
            name="flux-schnell",
            pipeline_class="FluxPipeline",
            build=_build_flux(guidance_embeds=False),
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 512},
            max_sequence_length=512,  # the __call__ default; schnell was trained with 256
        ),
        FamilySpec(
            name="flux-dev",
            pipeline_class="FluxPipeline",
            build=_build_flux(guidance_embeds=True),
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 512},
            max_sequence_length=512,
        ),
        FamilySpec(
            name="pixart-alpha",
            pipeline_class="PixArtAlphaPipeline",
            build=_build_pixart(sigma=False),
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=16,  # patch 2 (resolution binning, on by default, snaps any size to a bin)
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 512},
            max_sequence_length=120,
        ),
        FamilySpec(
            name="pixart-sigma",
            pipeline_class="PixArtSigmaPipeline",
            build=_build_pixart(sigma=True),
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=16,
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 512},
            max_sequence_length=300,
        ),
        FamilySpec(
            name="sana",
            pipeline_class="SanaPipeline",
            build=_build_sana,
            vae_scale_factor=32,
            latent_channels=32,
            default_size=1024,
            size_multiple=32,
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 8192},
            max_sequence_length=300,
        ),
    )
}


def families_2026() -> dict[str, Callable[[], Any]]:
    """The families people pick in 2026, built from diffusers' own test components (tests/builds_*.py)."""
    import importlib

    builds: dict[str, Callable[[], Any]] = {}
    for module in ("tests.builds_a", "tests.builds_b", "tests.builds_c"):
        try:
            builds.update(importlib.import_module(module).BUILDS)
        except ModuleNotFoundError:
            continue
    return builds


def build_pipeline(name: str) -> Any:
    """The family's pipeline in memory, seeded random weights (the same weights every call)."""
    pipe = FAMILIES[name].build() if name in FAMILIES else families_2026()[name]()
    for component in pipe.components.values():  # as from_pretrained leaves them: T5's dropout off
        if hasattr(component, "eval"):
            component.eval()
    return pipe


def build_family(name: str, out_dir: Path) -> Path:
    """Build family ``name`` and write it to ``out_dir`` with ``save_pretrained`` (safetensors)."""
    pipe = build_pipeline(name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


_BUILT: dict[str, Path] = {}
_ROOT: list[Path] = []


def built_family(name: str) -> Path:
    """``build_family`` into a temporary folder, once per process (removed when the process exits)."""
    if name not in FAMILIES and name not in families_2026():
        raise KeyError(f"unknown family {name!r}; known: {', '.join([*FAMILIES, *families_2026()])}")
    if name not in _BUILT:
        if not _ROOT:
            root = Path(tempfile.mkdtemp(prefix="t2i-families-"))
            atexit.register(shutil.rmtree, root, True)
            _ROOT.append(root)
        _BUILT[name] = build_family(name, _ROOT[0] / name)
    return _BUILT[name]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder; each family goes into OUT/<family>")
    parser.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help=f"default: all of {', '.join(FAMILIES)}; or any of {', '.join(families_2026())}",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.families if name not in FAMILIES and name not in families_2026()]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    for name in args.families or FAMILIES:
        t0 = time.time()
        path = build_family(name, args.out / name)
        print(f"{name}: {path} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()


def plain_diffusers_images(
    name: str, size: int, steps: int, guidance: float, seed: int, dtype: Any = None
) -> list[Any]:
    """Family ``name`` through a plain diffusers call of its built folder: ``"a red circle"`` at ``size``,
    one CPU generator seeded ``seed`` (the reference the app's pixels are held to)."""
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(built_family(name)), **({"torch_dtype": dtype} if dtype else {}))
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        images: list[Any] = pipe(
            prompt=["a red circle"],
            width=size,
            height=size,
            num_inference_steps=steps,
            guidance_scale=guidance,
            generator=[torch.Generator("cpu").manual_seed(seed)],
        ).images
    return images

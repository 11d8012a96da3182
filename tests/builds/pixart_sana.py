"""Tiny random-weight PixArt and Sana pipelines: PixArt-alpha (``pixart-alpha``), PixArt-Sigma
(``pixart-sigma``), Sana (``sana``) and Sana Sprint (``sana-sprint``).

Built from configs with the real models' structure wherever the app reads it: PixArt's VAEs downsample by 8
(alpha's SD VAE, Sigma's SDXL VAE), Sana's DC-AE by 32 with 32 latent channels, the transformers patchify as
the real ones, the T5 / Gemma tokenizers have the real maximum lengths. Sana Sprint follows diffusers' own
test components (``tests/pipelines/sana/test_sana_sprint.py``) on Sana's encoder and DC-AE.

    from tests.builds.pixart_sana import BUILDS
    pipe = BUILDS["sana"]()
"""

from __future__ import annotations

from typing import Any, Callable

from tests.builds.components import (
    SEED,
    gemma2_encoder,
    in_eval_mode,
    make_gemma_tokenizer,
    make_t5_tokenizer,
    t5_encoder,
    vae_sd,
    vae_sdxl,
)


def _scheduler(kind: str) -> Any:
    """As in the real model cards' scheduler_config.json."""
    from diffusers import DPMSolverMultistepScheduler

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


def _build_pixart(*, sigma: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import PixArtAlphaPipeline, PixArtSigmaPipeline, PixArtTransformer2DModel

        tokenizer = make_t5_tokenizer(512)
        text_encoder = t5_encoder(tokenizer, 64, seed=SEED)
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
        vae = vae_sdxl(SEED + 2) if sigma else vae_sd(1024, SEED + 2)
        return cls(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            transformer=transformer,
            scheduler=_scheduler("pixart"),
        )

    return build


def build_sana() -> Any:
    import torch
    from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel

    tokenizer = make_gemma_tokenizer()
    text_encoder = gemma2_encoder(tokenizer, SEED)
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


def build_sana_sprint() -> Any:
    """Sana_Sprint_1.6B_1024px_diffusers: Sana's Gemma 2 + DC-AE f32c32, a transformer with ``guidance_embeds``
    (guidance is an embedding, scaled by ``guidance_embeds_scale`` 0.1; no CFG, no negative prompt) and
    ``rms_norm_across_heads`` q/k norms, ``sample_size`` 32 (the only one resolution binning accepts), SCMScheduler."""
    import torch
    from diffusers import SanaSprintPipeline, SanaTransformer2DModel, SCMScheduler

    sana = build_sana()  # the tokenizer (SEED-free), Gemma 2 (SEED) and DC-AE (SEED + 2) of this module's Sana
    torch.manual_seed(SEED + 1)
    transformer = SanaTransformer2DModel(
        in_channels=32,
        out_channels=32,
        num_attention_heads=2,  # real: 70
        attention_head_dim=16,  # real: 32
        num_layers=2,  # real: 20
        num_cross_attention_heads=2,  # real: 20
        cross_attention_head_dim=16,  # real: 112
        cross_attention_dim=32,  # real: 2240
        caption_channels=32,  # Gemma 2's hidden size (real: 2304)
        mlp_ratio=2.5,
        attention_bias=False,
        sample_size=32,  # x32 = 1024 px
        patch_size=1,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        interpolation_scale=None,
        guidance_embeds=True,
        guidance_embeds_scale=0.1,
        qk_norm="rms_norm_across_heads",
    )
    return in_eval_mode(
        SanaSprintPipeline(
            tokenizer=sana.tokenizer,
            text_encoder=sana.text_encoder,
            vae=sana.vae,
            transformer=transformer,
            scheduler=SCMScheduler(num_train_timesteps=1000, prediction_type="trigflow", sigma_data=0.5),
        )
    )


BUILDS: dict[str, Callable[[], Any]] = {
    "pixart-alpha": _build_pixart(sigma=False),
    "pixart-sigma": _build_pixart(sigma=True),
    "sana": build_sana,
    "sana-sprint": build_sana_sprint,
}

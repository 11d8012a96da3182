"""Tiny random-weight Stable Diffusion pipelines: SD 1.x (``sd1``), SD 2.x v-prediction (``sd2-v``), SDXL
(``sdxl``), SD3 (``sd3``), SD-Turbo (``sd-turbo``) and SDXL with LCM's UNet (``sdxl-lcm``).

Built from configs with the real models' structure wherever the app reads it (``tests/builds/__init__.py``):
the VAE downsamples by 8, the latents have the real channel count, the denoiser's ``sample_size`` gives the
real default size, SD3's transformer patchifies by 2, the schedulers carry the real model cards' configs.
SD-Turbo and LCM-SDXL follow diffusers' own test components and their model cards.

    from tests.builds.stable_diffusion import BUILDS
    pipe = BUILDS["sdxl"]()
"""

from __future__ import annotations

from typing import Any, Callable

from tests.builds.components import (
    SD_BETAS,
    SEED,
    clip_text,
    in_eval_mode,
    make_clip_tokenizer,
    make_t5_tokenizer,
    t5_encoder,
    vae_kl,
    vae_sd,
    vae_sdxl,
)


def _scheduler(kind: str) -> Any:
    """As in the real model cards' scheduler_config.json."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, PNDMScheduler

    if kind == "sd1":  # stable-diffusion-v1-5
        return PNDMScheduler(**SD_BETAS, skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
    if kind == "sd2-v":  # stable-diffusion-2-1 (768, v-prediction)
        return DDIMScheduler(
            **SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1, prediction_type="v_prediction"
        )
    if kind == "sdxl":  # stable-diffusion-xl-base-1.0
        return EulerDiscreteScheduler(
            **SD_BETAS,
            steps_offset=1,
            timestep_spacing="leading",
            interpolation_type="linear",
            use_karras_sigmas=False,
            prediction_type="epsilon",
        )
    if kind == "sd3":  # stable-diffusion-3-medium-diffusers
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    raise KeyError(kind)


def build_sd1() -> Any:
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer()
    text_encoder = clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)
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
        vae=vae_sd(512, SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler("sd1"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_sd2_v() -> Any:
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer(pad_token="!")  # OpenCLIP ViT-H pads with "!"
    text_encoder = clip_text(tokenizer, 48, 32, act="gelu", with_projection=False, seed=SEED)
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
        vae=vae_sd(768, SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler("sd2-v"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_sdxl() -> Any:
    import torch
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer(pad_token="!")
    text_encoder = clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)  # CLIP ViT-L
    text_encoder_2 = clip_text(tokenizer_2, 64, 64, act="gelu", with_projection=True, seed=SEED + 3)  # bigG
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
        vae=vae_sdxl(SEED + 2),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=_scheduler("sdxl"),
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )


def build_sd3() -> Any:
    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer(pad_token="!")
    tokenizer_3 = make_t5_tokenizer(512)
    # CLIP-L (hidden 768 -> 32) and CLIP-G (1280 -> 64) both with projection; T5-XXL (4096 -> 128).
    text_encoder = clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=True, seed=SEED)
    text_encoder_2 = clip_text(tokenizer_2, 64, 64, act="gelu", with_projection=True, seed=SEED + 3)
    text_encoder_3 = t5_encoder(tokenizer_3, 128, seed=SEED + 4)
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
    vae = vae_kl(
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


def build_sd_turbo() -> Any:
    """stabilityai/sd-turbo: SD 2.1-base (OpenCLIP text encoder, 512 px epsilon UNet) with Euler, trailing spacing;
    adversarially distilled for 1 step at guidance 0.0 (no CFG, no negative prompt)."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel

    tokenizer = make_clip_tokenizer(pad_token="!")  # OpenCLIP ViT-H pads with "!"
    text_encoder = clip_text(tokenizer, 48, 32, act="gelu", with_projection=False, seed=SEED)
    torch.manual_seed(SEED + 1)
    unet = UNet2DConditionModel(
        sample_size=64,  # x8 = 512 px
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 16, 32, 32),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=48,
        attention_head_dim=(2, 2, 4, 4),  # SD 2.x: (5, 10, 20, 20) heads
        use_linear_projection=True,
        norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler(
        **SD_BETAS,
        steps_offset=1,
        timestep_spacing="trailing",
        interpolation_type="linear",
        use_karras_sigmas=False,
        prediction_type="epsilon",
    )
    return in_eval_mode(
        StableDiffusionPipeline(
            vae=vae_sd(512, SEED + 2),
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    )


def build_sdxl_lcm() -> Any:
    """SDXL base with latent-consistency/lcm-sdxl's UNet (``time_cond_proj_dim`` 256: guidance is an embedding,
    no CFG, the negative prompt unused) and ``LCMScheduler.from_config`` of SDXL's scheduler, as the model card does."""
    import torch
    from diffusers import LCMScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    sdxl = build_sdxl()  # this module's SDXL: the same encoders (SEED, SEED + 3) and VAE (SEED + 2)
    torch.manual_seed(SEED + 1)
    config = {k: v for k, v in sdxl.unet.config.items() if not k.startswith("_")}  # "_use_default_values" would
    unet = UNet2DConditionModel.from_config({**config, "time_cond_proj_dim": 256})  # reset time_cond_proj_dim
    return in_eval_mode(
        StableDiffusionXLPipeline(
            vae=sdxl.vae,
            text_encoder=sdxl.text_encoder,
            text_encoder_2=sdxl.text_encoder_2,
            tokenizer=sdxl.tokenizer,
            tokenizer_2=sdxl.tokenizer_2,
            unet=unet,
            # = LCMScheduler.from_config(SDXL's Euler config), as the card does, less the Euler-only keys
            scheduler=LCMScheduler(**SD_BETAS, steps_offset=1, timestep_spacing="leading", prediction_type="epsilon"),
            force_zeros_for_empty_prompt=True,
            add_watermarker=False,
        )
    )


BUILDS: dict[str, Callable[[], Any]] = {
    "sd1": build_sd1,
    "sd2-v": build_sd2_v,
    "sdxl": build_sdxl,
    "sd3": build_sd3,
    "sd-turbo": build_sd_turbo,
    "sdxl-lcm": build_sdxl_lcm,
}

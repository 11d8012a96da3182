"""Tiny random-weight pipelines of Krea 2 (``krea2``), Ideogram 4 (``ideogram4``), Lumina 2 (``lumina2``) and
CogView4 (``cogview4``).

The components follow diffusers' own test components (``get_dummy_components()`` in
``tests/pipelines/{krea2/test_krea2,lumina2/test_pipeline_lumina2,cogview4/test_cogview4}.py``
and, for Ideogram 4, which has no pipeline test, ``tests/lora/test_lora_layers_ideogram4.py``), with the
constructors of the installed diffusers 0.42.1, and with the real checkpoints' values wherever the app reads them:
the VAE downsampling, latent channels, patch sizes, the denoisers' ``sample_size``, the ``__call__``-relevant
config flags (Krea 2's ``is_distilled``) and the schedulers' configs. Nothing is downloaded: the
tokenizers are built here (Qwen2 byte-level BPE with the Qwen chat template, GLM-4's ``PreTrainedTokenizerFast``
with its ``[gMASK]<sop>`` prefix) or come from ``tests.builds.components`` (Gemma), as do Gemma 2 and the KL VAEs.

    from tests.builds.krea_ideogram_lumina_cogview import BUILDS
    pipe = BUILDS["cogview4"]()
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tests.builds.components import SEED, WORDS, gemma2_encoder, in_eval_mode, make_gemma_tokenizer, vae_kl

# --------------------------------------------------------------------------------------------
# Tokenizers.

# Words of the fixed prompt templates, so that each is one token as in the real vocabularies (Krea 2 drops exactly
# the 34 tokens of its system prefix and appends a 5-token suffix).
_TEMPLATE_WORDS = [
    "system",
    "user",
    "assistant",
    "Describe",
    "the",
    "image",
    "by",
    "detailing",
    "color",
    "shape",
    "size",
    "texture",
    "quantity",
    "text",
    "spatial",
    "relationships",
    "of",
    "objects",
    "and",
    "background",
    "You",
    "are",
    "an",
    "designed",
    "to",
    "generate",
    "superior",
    "images",
    "with",
    "degree",
    "alignment",
    "based",
    "on",
    "textual",
    "prompts",
    "or",
    "Prompt",
    "Start",
]

# Qwen3-VL's chat template, reduced to text and image parts (it adds no default system message).
_QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


@functools.lru_cache(maxsize=1)
def _byte_level_bpe() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """GPT-2-style byte-level BPE (the 256 byte symbols, then merges) in which every word, bare or after a space
    ("Ġword"), is a single token; learned once per process."""
    from pipeline.default_model.architecture import bytes_to_unicode, learn_merges

    words = sorted(set(WORDS) | set(_TEMPLATE_WORDS))
    split: dict[str, tuple[str, ...]] = {}
    for w in words:
        split["\u0120" + w] = tuple("\u0120" + w)
        split[w] = tuple(w)
    merges = learn_merges(split, 100_000)  # runs until every word is one symbol
    symbols = list(bytes_to_unicode().values()) + [a + b for a, b in merges]
    return tuple(dict.fromkeys(symbols)), tuple(merges)


def make_qwen_tokenizer(*, chat_template: str | None = None, model_max_length: int = 262144) -> Any:
    """A ``Qwen2Tokenizer`` (what Qwen3-VL's ``AutoTokenizer`` resolves to): byte-level BPE, pad = eos =
    ``<|endoftext|>``, the ChatML specials ``<|im_start|>``/``<|im_end|>`` and the vision placeholders."""
    from transformers import AddedToken, Qwen2Tokenizer

    symbols, merges = _byte_level_bpe()
    vocab = {tok: i for i, tok in enumerate(symbols)}
    for special in _QWEN_SPECIALS:
        vocab[special] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=list(merges),  # (a, b) pairs
        unk_token=None,  # Qwen has none
        eos_token="<|im_end|>" if chat_template else "<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(s, special=True, normalized=False) for s in _QWEN_SPECIALS[1:]]}
    )
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


def make_glm_tokenizer() -> Any:
    """GLM-4's ``PreTrainedTokenizerFast`` (glm-4-9b-hf, as CogView4 ships it): byte-level BPE, left padding,
    pad = eos = ``<|endoftext|>``, and ``add_special_tokens`` prefixes ``[gMASK]<sop>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    symbols, merges = _byte_level_bpe()
    vocab = {tok: i for i, tok in enumerate(symbols)}
    specials = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>"]
    specials += ["<|assistant|>", "<|observation|>"]
    for special in specials:
        vocab[special] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), ignore_merges=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    backend.post_processor = processors.TemplateProcessing(
        single="[gMASK]:0 <sop>:0 $A:0",
        pair="[gMASK]:0 <sop>:0 $A:0 $B:1",
        special_tokens=[("[gMASK]", vocab["[gMASK]"]), ("<sop>", vocab["<sop>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_max_length=128000,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Text encoders.


def _qwen3_vl(tokenizer: Any, *, hidden: int, layers: int, seed: int) -> Any:
    """A ``Qwen3VLModel`` (text + a two-block vision tower) with mRoPE sections summing to half the head dim."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLModel

    vocab = tokenizer.get_vocab()
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 262144,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [2, 1, 1],  # real: [24, 20, 20] (head dim 128)
                "mrope_interleaved": True,
            },
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    return Qwen3VLModel(config).eval()


# --------------------------------------------------------------------------------------------
# Families.


def build_krea2() -> Any:
    """Krea 2 (base): Qwen3-VL text encoder tapped at several layers, the Qwen-Image VAE (f8, 16 channels, 5-D),
    latents packed 2x2 (64 transformer channels), a dynamic-shift flow-match Euler scheduler."""
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        Krea2Pipeline,
        Krea2Transformer2DModel,
    )

    tokenizer = make_qwen_tokenizer()
    text_encoder = _qwen3_vl(tokenizer, hidden=16, layers=3, seed=SEED)  # real: Qwen3-VL-4B (2560 x 36)
    torch.manual_seed(SEED + 1)
    transformer = Krea2Transformer2DModel(
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=2,  # real: 28
        attention_head_dim=8,  # real: 128
        num_attention_heads=4,  # real: 48
        num_key_value_heads=2,  # real: 12
        intermediate_size=64,
        timestep_embed_dim=8,
        text_hidden_dim=16,  # the text encoder's hidden size (real: 2560)
        num_text_layers=3,  # = len(text_encoder_select_layers) (real: 12)
        text_num_attention_heads=2,
        text_num_key_value_heads=1,
        text_intermediate_size=16,
        num_layerwise_text_blocks=1,
        num_refiner_text_blocks=1,
        axes_dims_rope=(4, 2, 2),  # real: (32, 48, 48); sums to the head dim
        rope_theta=1000.0,
    )
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLQwenImage(  # Qwen-Image's VAE: three downsamples (8x), the real latents_mean / latents_std
        base_dim=16,  # real: 96
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,  # real: 2
        temperal_downsample=[False, True, True],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=6400,
    )
    return in_eval_mode(
        Krea2Pipeline(
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            text_encoder_select_layers=(1, 2, 3),  # real: (2, 5, ..., 35)
            is_distilled=False,  # the 8-step TDM checkpoint sets True (fixed mu = 1.15)
            patch_size=2,
        )
    )


def build_ideogram4() -> Any:
    """Ideogram 4: a Qwen3-VL text encoder deep enough for the fixed taps (layers 0..35), two transformers
    (conditional and unconditional: asymmetric CFG), the FLUX.2 VAE (f8, 32 channels, patchified 2x2 -> 128)."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Ideogram4Pipeline,
        Ideogram4Transformer2DModel,
    )
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS

    tokenizer = make_qwen_tokenizer(chat_template=_QWEN3_VL_CHAT_TEMPLATE)
    hidden = 8  # real (Qwen3-VL-8B): 4096
    text_encoder = _qwen3_vl(tokenizer, hidden=hidden, layers=max(QWEN3_VL_ACTIVATION_LAYERS) + 1, seed=SEED)
    transformer_kwargs = dict(
        in_channels=128,  # 32 latent channels patchified 2x2
        num_layers=2,  # real: 34
        attention_head_dim=8,  # real: 256
        num_attention_heads=4,  # real: 18
        intermediate_size=32,
        adaln_dim=16,  # real: 512
        llm_features_dim=len(QWEN3_VL_ACTIVATION_LAYERS) * hidden,  # real: 13 x 4096 = 53248
        rope_theta=5_000_000,
        mrope_section=(2, 1, 1),  # real: (24, 20, 20); sums to half the head dim
        norm_eps=1e-5,
    )
    torch.manual_seed(SEED + 1)
    transformer = Ideogram4Transformer2DModel(**transformer_kwargs)
    torch.manual_seed(SEED + 5)
    unconditional_transformer = Ideogram4Transformer2DModel(**transformer_kwargs)
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLFlux2(  # FLUX.2's VAE: four blocks (8x), 32 latent channels, batch norm over 2x2 patches
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=32,
        norm_num_groups=8,
        sample_size=1024,
        patch_size=(2, 2),
    )
    return in_eval_mode(
        Ideogram4Pipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(
                num_train_timesteps=1000, shift=1.0
            ),  # sigmas come from the pipeline
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            unconditional_transformer=unconditional_transformer,
        )
    )


def build_lumina2() -> Any:
    """Lumina-Image-2.0: Gemma 2 (penultimate hidden state), the FLUX VAE (16 channels), a patch-2 transformer with
    ``sample_size`` 128 (1024 px), flow-match Euler with shift 6."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    tokenizer = make_gemma_tokenizer()
    text_encoder = gemma2_encoder(tokenizer, SEED)
    torch.manual_seed(SEED + 1)
    transformer = Lumina2Transformer2DModel(
        sample_size=128,  # x8 = 1024 px
        patch_size=2,
        in_channels=16,
        hidden_size=32,  # real: 2304
        num_layers=2,  # real: 26
        num_refiner_layers=1,  # real: 2
        num_attention_heads=2,  # real: 24
        num_kv_heads=1,  # real: 8
        multiple_of=16,
        ffn_dim_multiplier=None,
        norm_eps=1e-5,
        scaling_factor=1.0,
        axes_dim_rope=(8, 4, 4),  # real: (32, 32, 32); sums to the head dim
        axes_lens=(300, 512, 512),
        cap_feat_dim=32,  # Gemma 2's hidden size (real: 2304)
    )
    vae = vae_kl(
        16, 1024, SEED + 2, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=6.0, use_dynamic_shifting=False)
    return in_eval_mode(
        Lumina2Pipeline(
            transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer
        )
    )


def build_cogview4() -> Any:
    """CogView4-6B: GLM-4 (``GlmModel``, penultimate hidden state, prompt left-padded to a multiple of 16), its
    16-channel VAE (scaling 1.0), a patch-2 transformer with ``sample_size`` 128, linear-shift flow-match Euler."""
    import torch
    from diffusers import AutoencoderKL, CogView4Pipeline, CogView4Transformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import GlmConfig, GlmModel

    tokenizer = make_glm_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = GlmModel(
        GlmConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,  # real (glm-4-9b): 4096
            intermediate_size=64,
            num_hidden_layers=2,  # real: 40
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    torch.manual_seed(SEED + 1)
    transformer = CogView4Transformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,  # real: 28
        attention_head_dim=8,  # real: 128
        num_attention_heads=4,  # real: 32
        text_embed_dim=32,  # GLM's hidden size (real: 4096)
        time_embed_dim=8,  # real: 512
        condition_dim=4,  # real: 256
        pos_embed_max_size=128,
        sample_size=128,  # x8 = 1024 px
    )
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),  # real: (128, 512, 1024, 1024)
        layers_per_block=1,  # real: 3
        latent_channels=16,
        norm_num_groups=8,
        sample_size=1024,
        scaling_factor=1.0,
        shift_factor=0.0,
        force_upcast=True,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_shift=0.25, max_shift=0.75, base_image_seq_len=256, use_dynamic_shifting=True, time_shift_type="linear"
    )
    return in_eval_mode(
        CogView4Pipeline(
            tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
        )
    )


BUILDS: dict[str, Callable[[], Any]] = {
    "krea2": build_krea2,
    "ideogram4": build_ideogram4,
    "lumina2": build_lumina2,
    "cogview4": build_cogview4,
}

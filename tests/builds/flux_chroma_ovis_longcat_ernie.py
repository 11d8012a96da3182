"""Tiny random-weight pipelines of FLUX and the families built on its parts: FLUX.1 (``flux-schnell``,
``flux-dev``), FLUX.2 (``flux2-dev``, ``flux2-klein``, ``flux2-klein-base``), Chroma (``chroma``), Ovis-Image
(``ovis-image``), LongCat-Image (``longcat-image``) and ERNIE-Image (``ernie-image``).

FLUX.1 is built from configs like the Stable Diffusion builds (CLIP-L pooled + T5, its 16-channel KL VAE,
latents packed 2x2, the real schedulers' configs). The others' components follow diffusers' own test
components (``get_dummy_components()`` in ``tests/pipelines/flux2/test_pipeline_flux2.py``, ``.../flux2/test_pipeline_flux2_klein.py``,
``.../chroma/test_pipeline_chroma.py``, ``.../ovis_image/test_ovis_image.py``; LongCat-Image and
ERNIE-Image have no pipeline test there, so their denoisers follow
``tests/models/transformers/test_models_transformer_{longcat,ernie}_image.py`` and the rest mirrors
the FLUX.2 / Ovis components), with the constructors of the installed diffusers 0.42.1 -- but with
the real models' structure wherever the app reads it: the VAEs have four blocks (FLUX.2's and ERNIE's
``AutoencoderKLFlux2`` with 32 latent channels patchified 2x2 to 128, FLUX.1's 16-channel KL VAE for
Chroma / Ovis / LongCat), so ``pipe.vae_scale_factor`` is the real one (8; ERNIE counts the patchify:
16); the text encoders have enough layers for the pipelines' default ``text_encoder_out_layers``
(FLUX.2-dev reads Mistral layers 10/20/30, klein Qwen3 layers 9/18/27) and hidden sizes matching the
denoisers' ``joint_attention_dim``; the schedulers carry the real ``scheduler_config.json`` values.

Nothing is downloaded: the tokenizers are learned here from the default model's word list (byte-level
BPE ``Qwen2Tokenizer`` for the Qwen families, byte-fallback BPE ``LlamaTokenizer`` for the Mistral /
Ministral ones, the shared ``T5Tokenizer`` for Chroma), with small Jinja chat templates rendering like
the real ones. Without torchvision, FLUX.2-dev's real ``PixtralProcessor`` cannot be built, so its
``tokenizer`` is the plain ``LlamaTokenizer`` (the pipeline only calls ``apply_chat_template`` and, for
caption upsampling, ``.tokenizer.batch_decode``), and LongCat's ``text_processor`` (a ``Qwen2VLProcessor``,
whose video-processor slot needs torchvision) is a second ``Qwen2Tokenizer`` with the Qwen2-VL chat
template, which serves the pipeline's prompt rewriting (``apply_chat_template``, ``__call__(text=...)``,
``batch_decode``).

    from tests.builds.flux_chroma_ovis_longcat_ernie import BUILDS
    pipe = BUILDS["flux2-klein"]()
"""

from __future__ import annotations

from functools import cache
from typing import Any, Callable

from pipeline.default_model.architecture import CORPUS, bytes_to_unicode, learn_merges
from tests.builds.components import SEED, clip_text, make_clip_tokenizer, make_t5_tokenizer, t5_encoder

_WORDS: list[str] = sorted(set(CORPUS))
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()[]/&+*=_#%@<>"
_BPE_MERGES = 200


# --------------------------------------------------------------------------------------------
# Tokenizers.

# Qwen3's chat template (Qwen3-4B, Ovis2.5's LLM), text only: thinking is switched off with an empty
# <think></think> block when `enable_thinking=False`, as the real template does.
_QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Qwen2-VL / Qwen2.5-VL's chat template: a default system turn, images as vision placeholders.
_QWEN2_VL_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content %}{%- set image_count.value = image_count.value + 1 %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in content %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Mistral-Small-3.1's chat template (V7 tekken), text only: <s>[SYSTEM_PROMPT]..[/SYSTEM_PROMPT][INST]..[/INST].
_MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = namespace(text='') %}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{%- set content.text = content.text + block['text'] %}"
    "{%- elif block['type'] == 'image' %}{%- set content.text = content.text + '[IMG]' %}{%- endif %}"
    "{%- endfor %}{%- set content = content.text %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + content + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + content + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- content + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_QWEN_ADDED = ["<think>", "</think>"]  # Qwen3's (not special: they are decoded)

# tekken's first control tokens, in their real order (ids 0..19); [IMG] is 10 and <pad> 11 as in Mistral-Small-3.1.
_MISTRAL_SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
]


@cache
def _byte_level_merges() -> tuple[tuple[str, str], ...]:
    """GPT-2 byte-level BPE merges over "Ġword" (Qwen2's scheme), learned once per process."""
    byte_chars = bytes_to_unicode()
    space = byte_chars[ord(" ")]
    split = {space + w: (space,) + tuple(byte_chars[b] for b in w.encode("utf-8")) for w in _WORDS}
    return tuple(learn_merges(split, _BPE_MERGES))


@cache
def _sentencepiece_merges() -> tuple[tuple[str, str], ...]:
    """SentencePiece-style BPE merges over "▁word", learned once per process."""
    return tuple(learn_merges({w: tuple("\u2581" + w) for w in _WORDS}, _BPE_MERGES))


def make_qwen2_tokenizer(
    *, eos_token: str, chat_template: str, model_max_length: int = 131072, padding_side: str = "right"
) -> Any:
    """A byte-level BPE ``Qwen2Tokenizer`` (GPT-2 bytes, "Ġword" merges) with Qwen's special tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    merges = list(_byte_level_merges())
    vocab_list = list(bytes_to_unicode().values()) + [a + b for a, b in merges]
    vocab_list += _QWEN_SPECIALS + _QWEN_ADDED
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,  # (a, b) pairs
        unk_token=None,  # as Qwen's tokenizer_config.json: none
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        padding_side=padding_side,
    )
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in _QWEN_SPECIALS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in _QWEN_ADDED])
    tokenizer.chat_template = chat_template
    return tokenizer


def make_mistral_tokenizer(
    *, model_max_length: int = 131072, chat_template: str | None = _MISTRAL_CHAT_TEMPLATE
) -> Any:
    """A byte-fallback BPE ``LlamaTokenizer`` with tekken's control tokens (<s>=1, </s>=2, [IMG]=10, <pad>=11)."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizer

    vocab_list = list(_MISTRAL_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    vocab_list += sorted(set(_CHARS) | {"\u2581"} | set("".join(_WORDS)))
    merges = list(_sentencepiece_merges())
    for a, b in merges:
        vocab_list.append(a + b)
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = LlamaTokenizer(
        vocab=vocab,
        merges=merges,  # (a, b) pairs
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        add_bos_token=True,
        add_eos_token=False,
        model_max_length=model_max_length,
    )
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in _MISTRAL_SPECIALS[3:]])
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


# --------------------------------------------------------------------------------------------
# Text encoders.


def _mistral_text_config(tokenizer: Any, hidden: int, layers: int) -> dict[str, Any]:
    return {
        "model_type": "mistral",
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "max_position_embeddings": 131072,
        "num_attention_heads": 2,
        "num_hidden_layers": layers,
        "num_key_value_heads": 1,
        "head_dim": hidden // 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _mistral3_config(tokenizer: Any, hidden: int, layers: int) -> Any:
    from transformers import Mistral3Config

    return Mistral3Config(
        text_config=_mistral_text_config(tokenizer, hidden, layers),
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "image_size": 28,
            "patch_size": 14,
            "num_channels": 3,
        },
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        vision_feature_layer=-1,
        spatial_merge_size=2,
    )


def _qwen3_config(tokenizer: Any, hidden: int, layers: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )


# --------------------------------------------------------------------------------------------
# VAEs (four blocks) and schedulers.


def _vae_flux2(seed: int) -> Any:
    """FLUX.2's VAE (also ERNIE-Image's): 32 latent channels, 8x, batch-norm over the 2x2-patchified 128."""
    import torch
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(seed)
    return AutoencoderKLFlux2(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),  # real: (128, 256, 512, 512)
        layers_per_block=1,
        latent_channels=32,
        norm_num_groups=8,
        sample_size=1024,
        use_quant_conv=True,
        use_post_quant_conv=True,
    )


def _vae_flux1(seed: int) -> Any:
    """FLUX.1's 16-channel KL VAE (Chroma, Ovis-Image, LongCat-Image): 8x, scaling 0.3611, shift 0.1159."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=8,
        sample_size=1024,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def _scheduler(kind: str) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler

    flux = dict(
        num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15
    )
    if kind == "flux2":  # FLUX.2-dev / klein: the pipeline passes its own empirical mu
        return FlowMatchEulerDiscreteScheduler(
            **flux, shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential"
        )
    if kind == "flux1-dev":  # FLUX.1-dev, Chroma1-HD, Ovis-Image-7B, LongCat-Image: FLUX.1-dev's
        return FlowMatchEulerDiscreteScheduler(**flux, shift=3.0, use_dynamic_shifting=True)
    if kind == "flux1-schnell":
        return FlowMatchEulerDiscreteScheduler(**flux, shift=1.0, use_dynamic_shifting=False)
    if kind == "ernie":  # the pipeline passes sigmas and no mu: dynamic shifting must be off
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    raise KeyError(kind)


# --------------------------------------------------------------------------------------------
# Families.


def _build_flux1(*, guidance_embeds: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import FluxPipeline, FluxTransformer2DModel

        tokenizer = make_clip_tokenizer()
        tokenizer_2 = make_t5_tokenizer(512)
        text_encoder = clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=SEED)
        text_encoder_2 = t5_encoder(tokenizer_2, 64, seed=SEED + 4)
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
        vae = _vae_flux1(SEED + 2)
        return FluxPipeline(
            scheduler=_scheduler("flux1-dev" if guidance_embeds else "flux1-schnell"),
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            transformer=transformer,
        )

    return build


def build_flux2_dev() -> Any:
    """FLUX.2-dev: Mistral-Small-3.1 (40 layers; prompt = layers 10, 20, 30 stacked) + guidance-embedded DiT."""
    import torch
    from diffusers import Flux2Pipeline, Flux2Transformer2DModel
    from transformers import Mistral3ForConditionalGeneration

    tokenizer = make_mistral_tokenizer()
    hidden = 16  # real: 5120
    torch.manual_seed(SEED)
    text_encoder = Mistral3ForConditionalGeneration(_mistral3_config(tokenizer, hidden, layers=40)).eval()
    torch.manual_seed(SEED + 1)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=128,  # 32 latent channels patchified 2x2
        num_layers=1,  # real: 8
        num_single_layers=1,  # real: 48
        attention_head_dim=16,  # real: 128
        num_attention_heads=2,  # real: 48
        joint_attention_dim=3 * hidden,  # three stacked hidden-state layers (real: 15360)
        timestep_guidance_channels=256,
        axes_dims_rope=(4, 4, 4, 4),  # real: (32, 32, 32, 32); sums to the head dim
        guidance_embeds=True,
    )
    return Flux2Pipeline(
        scheduler=_scheduler("flux2"),
        vae=_vae_flux2(SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def _build_flux2_klein(*, is_distilled: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel
        from transformers import Qwen3ForCausalLM

        tokenizer = make_qwen2_tokenizer(eos_token="<|im_end|>", chat_template=_QWEN3_CHAT_TEMPLATE)
        hidden = 16  # real (Qwen3-4B): 2560
        torch.manual_seed(SEED)
        text_encoder = Qwen3ForCausalLM(_qwen3_config(tokenizer, hidden, layers=36)).eval()
        torch.manual_seed(SEED + 1)
        transformer = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=128,
            num_layers=1,  # real (4B): 5
            num_single_layers=1,  # real (4B): 20
            attention_head_dim=16,  # real: 128
            num_attention_heads=2,  # real (4B): 24
            joint_attention_dim=3 * hidden,  # layers 9, 18, 27 stacked (real 4B: 7680)
            timestep_guidance_channels=256,
            axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=False,
        )
        return Flux2KleinPipeline(
            scheduler=_scheduler("flux2"),
            vae=_vae_flux2(SEED + 2),
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            is_distilled=is_distilled,
        )

    return build


build_flux2_klein = _build_flux2_klein(is_distilled=True)
build_flux2_klein_base = _build_flux2_klein(is_distilled=False)


def build_chroma() -> Any:
    """Chroma1-HD: T5-XXL (masked) + a FLUX.1-schnell-derived DiT whose modulations come from an approximator."""
    import torch
    from diffusers import ChromaPipeline, ChromaTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    tokenizer = make_t5_tokenizer(512)
    torch.manual_seed(SEED)
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=64,  # real: 4096
            d_kv=8,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
            use_cache=False,
            pad_token_id=0,
            eos_token_id=1,
        )
    ).eval()
    torch.manual_seed(SEED + 1)
    transformer = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=1,  # real: 19
        num_single_layers=1,  # real: 38
        attention_head_dim=16,  # real: 128
        num_attention_heads=2,  # real: 24
        joint_attention_dim=64,  # T5's d_model
        axes_dims_rope=(4, 6, 6),  # real: (16, 56, 56)
        approximator_num_channels=16,  # real: 64
        approximator_hidden_dim=32,  # real: 5120
        approximator_layers=1,  # real: 5
    )
    return ChromaPipeline(
        scheduler=_scheduler("flux1-dev"),
        vae=_vae_flux1(SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        image_encoder=None,
        feature_extractor=None,
    )


def build_ovis_image() -> Any:
    """Ovis-Image-7B: Ovis2.5-2B's Qwen3 LLM (last hidden state) + a FLUX-style MMDiT."""
    import torch
    from diffusers import OvisImagePipeline, OvisImageTransformer2DModel
    from transformers import Qwen3Model

    tokenizer = make_qwen2_tokenizer(eos_token="<|im_end|>", chat_template=_QWEN3_CHAT_TEMPLATE)
    hidden = 32  # real: 2048
    torch.manual_seed(SEED)
    text_encoder = Qwen3Model(_qwen3_config(tokenizer, hidden, layers=2)).eval()
    torch.manual_seed(SEED + 1)
    transformer = OvisImageTransformer2DModel(
        patch_size=1,
        in_channels=64,
        out_channels=64,
        num_layers=1,  # real: 6
        num_single_layers=1,  # real: 27
        attention_head_dim=16,  # real: 128
        num_attention_heads=2,  # real: 24
        joint_attention_dim=hidden,
        axes_dims_rope=(4, 6, 6),
    )
    return OvisImagePipeline(
        scheduler=_scheduler("flux1-dev"),
        vae=_vae_flux1(SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def build_longcat_image() -> Any:
    """LongCat-Image: Qwen2.5-VL-7B (last hidden state, also the prompt rewriter) + a FLUX-style MMDiT."""
    import torch
    from diffusers import LongCatImagePipeline, LongCatImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = make_qwen2_tokenizer(eos_token="<|im_end|>", chat_template=_QWEN2_VL_CHAT_TEMPLATE)
    # it pads a batch for generate(): left
    text_processor = make_qwen2_tokenizer(
        eos_token="<|im_end|>", chat_template=_QWEN2_VL_CHAT_TEMPLATE, padding_side="left"
    )
    hidden = 32  # real: 3584
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(SEED)
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config={
                "vocab_size": len(tokenizer),
                "hidden_size": hidden,
                "intermediate_size": hidden * 2,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 128000,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
                "bos_token_id": ids("<|endoftext|>"),
                "eos_token_id": ids("<|im_end|>"),
                "pad_token_id": tokenizer.pad_token_id,
            },
            vision_config={
                "depth": 1,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_heads": 2,
                "out_hidden_size": hidden,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "fullatt_block_indexes": [0],
                "window_size": 112,
            },
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
        )
    ).eval()
    torch.manual_seed(SEED + 1)
    transformer = LongCatImageTransformer2DModel(
        patch_size=1,
        in_channels=64,  # the pipeline hard-codes 16 latent channels, packed 2x2
        num_layers=1,  # real: 19
        num_single_layers=1,  # real: 38
        attention_head_dim=16,  # real: 128
        num_attention_heads=2,  # real: 24
        joint_attention_dim=hidden,
        pooled_projection_dim=hidden,
        axes_dims_rope=(4, 6, 6),  # real: (16, 56, 56)
    )
    return LongCatImagePipeline(
        scheduler=_scheduler("flux1-dev"),
        vae=_vae_flux1(SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        # The real text_processor is a Qwen2VLProcessor, which cannot be built without torchvision (its
        # video-processor slot is checked against a torchvision-only class). The pipeline only calls its
        # apply_chat_template / __call__(text=...) / batch_decode (prompt rewriting), which a tokenizer has.
        text_processor=text_processor,
        transformer=transformer,
    )


def build_ernie_image() -> Any:
    """ERNIE-Image: a Ministral-3 ``Mistral3Model`` (second-to-last hidden state) + a single-stream DiT, no PE."""
    import torch
    from diffusers import ErnieImagePipeline, ErnieImageTransformer2DModel
    from transformers import Mistral3Model

    tokenizer = make_mistral_tokenizer(chat_template=None)
    hidden = 16  # real: 3072
    torch.manual_seed(SEED)
    text_encoder = Mistral3Model(_mistral3_config(tokenizer, hidden, layers=2)).eval()
    torch.manual_seed(SEED + 1)
    transformer = ErnieImageTransformer2DModel(
        hidden_size=32,  # real: 3072
        num_attention_heads=2,  # real: 24
        num_layers=1,  # real: 24
        ffn_hidden_size=64,  # real: 8192
        in_channels=128,  # 32 latent channels patchified 2x2
        out_channels=128,
        patch_size=1,
        text_in_dim=hidden,
        rope_theta=256,
        rope_axes_dim=(8, 4, 4),  # sums to the head dim (real: (32, 48, 48))
        eps=1e-6,
        qk_layernorm=True,
    )
    return ErnieImagePipeline(
        transformer=transformer,
        vae=_vae_flux2(SEED + 2),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=_scheduler("ernie"),
        pe=None,
        pe_tokenizer=None,
    )


BUILDS: dict[str, Callable[[], Any]] = {
    "flux-schnell": _build_flux1(guidance_embeds=False),
    "flux-dev": _build_flux1(guidance_embeds=True),
    "flux2-dev": build_flux2_dev,
    "flux2-klein": build_flux2_klein,
    "flux2-klein-base": build_flux2_klein_base,
    "chroma": build_chroma,
    "ovis-image": build_ovis_image,
    "longcat-image": build_longcat_image,
    "ernie-image": build_ernie_image,
}

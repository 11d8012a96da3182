"""Tiny random-weight pipelines of Qwen-Image (``qwen-image``), Z-Image (``z-image-turbo``, ``z-image``),
HiDream-I1 (``hidream``), HunyuanImage-2.1 (``hunyuanimage-2.1``) and Kandinsky 5.0 T2I (``kandinsky5``),
built in memory in a few seconds.

The components follow diffusers' own test components (``get_dummy_components()`` in
``tests/pipelines/{qwenimage,z_image,hidream_image,hunyuan_image_21,kandinsky5}/test_*.py`` of the diffusers
repository), with the constructors of the installed diffusers, but with the real checkpoints' values where the
app reads them: the VAEs downsample like the real ones (8x, HunyuanImage's 32x), the latent channel counts, patch
sizes, ``guidance_embeds`` flags, the transformer sizes that fix the default size (HiDream's ``max_resolution``),
the schedulers (and HunyuanImage's guiders) of the real ``scheduler_config.json`` files, and the tokenizers' real
maximum lengths. The dummy components download tiny tokenizers from the hub; here they are built locally in the
same classes: byte-level BPE ``Qwen2Tokenizer`` (Qwen2.5-VL / Qwen3) and a Llama-3 style
``PreTrainedTokenizerFast`` learned from the default model's word list plus the words of the pipelines' fixed
prompt templates -- so that the templates tokenize to exactly as many tokens as with the real tokenizers (the
pipelines drop that many leading hidden states: 34 for Qwen-Image / HunyuanImage, 40 for Kandinsky 5) -- and the
CLIP / T5 tokenizers of ``tests.builds.components``; ByT5 needs no files. Text-encoder vocabularies are ``len(tokenizer)``.

    from tests.builds.qwen_image_z_image_hidream_hunyuan_kandinsky import BUILDS
    pipe = BUILDS["qwen-image"]()          # a QwenImagePipeline, seeded random weights

Kandinsky 5's ``tokenizer`` component is a ``Qwen2VLProcessor`` in the real checkpoint; its video processor needs
torchvision, which is not installed here, so the build stores the processor's ``Qwen2Tokenizer`` alone (the
pipeline only ever calls ``tokenizer(text=..., images=None, videos=None, ...)`` and ``tokenizer.decode``).
"""

from __future__ import annotations

from typing import Any, Callable

from pipeline.default_model.architecture import CORPUS, bytes_to_unicode, learn_merges
from tests.builds.components import SEED, in_eval_mode, make_clip_tokenizer, make_t5_tokenizer, t5_encoder, vae_kl

# --------------------------------------------------------------------------------------------
# Byte-level BPE tokenizers (Qwen2 / Qwen3 / Llama 3 style), learned locally.

# The words of the pipelines' fixed prompt templates (Qwen-Image, HunyuanImage, Kandinsky 5), so that the
# templates tokenize word by word like the real 150k-token vocabularies do.
_TEMPLATE_WORDS = [
    "system",
    "user",
    "assistant",
    "You",
    "are",
    "a",
    "prompt",
    "engineer",
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
]

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen3's chat template, reduced to what a single user turn renders (enable_thinking=False adds the empty
# think block, as the real template does).
_QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Qwen2.5-VL's chat template for text-only messages (default system prompt, then the turns).
_QWEN25VL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for c in message['content'] %}"
    "{%- if c['type'] == 'text' %}{{- c['text'] }}"
    "{%- elif c['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def _byte_bpe(extra_words: tuple[str, ...] = ()) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2 style byte-level BPE (no end-of-word marker): every word, bare and with its leading space ("Ġ"),
    becomes one token; the 256 byte symbols spell anything else."""
    byte_chars = list(bytes_to_unicode().values())
    space = bytes_to_unicode()[ord(" ")]
    words = sorted(set(CORPUS) | set(extra_words))
    split = {}
    for w in words:
        split[w] = tuple(w)
        split[space + w] = (space,) + tuple(w)
    merges = learn_merges(split, 100_000)  # until every word is a single symbol
    vocab_list = list(byte_chars) + [a + b for a, b in merges]
    return {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}, merges


def make_qwen_tokenizer(chat_template: str | None = None, extra_tokens: tuple[str, ...] = ()) -> Any:
    """A byte-level BPE ``Qwen2Tokenizer`` like Qwen2.5-VL's / Qwen3's: pad <|endoftext|>, eos <|im_end|>,
    no bos, right padding, model_max_length 131072."""
    from transformers import Qwen2Tokenizer

    vocab, merges = _byte_bpe(tuple(_TEMPLATE_WORDS))
    for tok in _QWEN_SPECIALS + list(extra_tokens):
        vocab.setdefault(tok, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,  # it takes (a, b) pairs
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=_QWEN_SPECIALS[1:],
        model_max_length=131072,
        errors="replace",
    )
    tokenizer.padding_side = "right"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def make_llama3_tokenizer() -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` like Llama 3.1 Instruct's: bos <|begin_of_text|> prepended,
    eos <|eot_id|>, model_max_length 131072."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _byte_bpe()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    for tok in specials:
        vocab.setdefault(tok, len(vocab))
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    bos = vocab["<|begin_of_text|>"]
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        additional_special_tokens=specials[1:2] + specials[3:],
        model_max_length=131072,
    )
    return tokenizer


# --------------------------------------------------------------------------------------------
# Text encoders.


def _qwen25_vl(tokenizer: Any, hidden: int, seed: int, layers: int = 2) -> Any:
    """A tiny ``Qwen2_5_VLForConditionalGeneration`` (text hidden ``hidden``, two heads, one-block vision tower)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = hidden // 2
    q = head_dim // 8
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [q, q, head_dim // 2 - 2 * q], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "max_position_embeddings": 128000,
            "vocab_size": len(tokenizer),
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": hidden,
        },
        hidden_size=hidden,
        vocab_size=len(tokenizer),
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        vision_token_id=tokenizer.convert_tokens_to_ids("<|vision_pad|>"),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _clip_text_long(tokenizer: Any, hidden: int, projection: int, *, act: str, positions: int, seed: int) -> Any:
    """``CLIPTextModelWithProjection`` with ``positions`` position embeddings (HiDream's Long-CLIP: 248)."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    vocab = tokenizer.get_vocab()
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=positions,
        hidden_act=act,
        projection_dim=projection,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return CLIPTextModelWithProjection(config)


# --------------------------------------------------------------------------------------------
# Families.


def build_qwen_image() -> Any:
    """``QwenImagePipeline`` like Qwen/Qwen-Image: Qwen2.5-VL text encoder, 16-channel 8x Wan-style VAE,
    2x2-packed latents (``in_channels`` 64), no guidance embedding (true CFG), 1024 px default."""
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    tokenizer = make_qwen_tokenizer(_QWEN25VL_CHAT_TEMPLATE)
    text_encoder = _qwen25_vl(tokenizer, 32, SEED)
    torch.manual_seed(SEED + 1)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,  # 16 latent channels packed 2x2
        out_channels=16,
        num_layers=2,  # real: 60
        attention_head_dim=16,  # real: 128
        num_attention_heads=2,  # real: 24
        joint_attention_dim=32,  # Qwen2.5-VL's hidden size (real: 3584)
        guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),  # real: (16, 56, 56); sums to the head dim
    )
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLQwenImage(  # the real latents_mean / latents_std are the class defaults
        base_dim=16,  # real: 96
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,  # real: 2
        attn_scales=[],
        temperal_downsample=[False, True, True],  # three downsamples: vae_scale_factor 8
        dropout=0.0,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(  # Qwen-Image's scheduler_config.json
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=0.9,
        base_image_seq_len=256,
        max_image_seq_len=8192,
        shift_terminal=0.02,
        time_shift_type="exponential",
        invert_sigmas=False,
        stochastic_sampling=False,
        use_karras_sigmas=False,
        use_exponential_sigmas=False,
        use_beta_sigmas=False,
    )
    return in_eval_mode(
        QwenImagePipeline(
            scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
        )
    )


def _build_z_image(*, turbo: bool) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
        from transformers import Qwen3Config, Qwen3Model

        tokenizer = make_qwen_tokenizer(_QWEN3_CHAT_TEMPLATE, extra_tokens=("<think>", "</think>"))
        torch.manual_seed(SEED)
        text_encoder = Qwen3Model(  # Qwen3-4B (hidden 2560, 36 layers); the pipeline reads hidden_states[-2]
            Qwen3Config(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=40960,
                rope_theta=1000000.0,
                tie_word_embeddings=True,
                bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
        torch.manual_seed(SEED + 1)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=16,
            dim=32,  # real: 3840
            n_layers=2,  # real: 30
            n_refiner_layers=1,  # real: 2
            n_heads=2,  # real: 30
            n_kv_heads=2,
            norm_eps=1e-5,
            qk_norm=True,
            cap_feat_dim=32,  # Qwen3's hidden size (real: 2560)
            rope_theta=256.0,
            t_scale=1000.0,
            axes_dims=[4, 6, 6],  # real: [32, 48, 48]; sums to the head dim
            axes_lens=[1536, 512, 512],
        )
        with torch.no_grad():  # created with torch.empty: fix them (as diffusers' test does)
            transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
            transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
        # The FLUX.1 VAE's configuration (Z-Image ships its own weights for it).
        vae = vae_kl(
            16,
            1024,
            SEED + 2,
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        )
        # Z-Image-Turbo: fixed shift 3.0; Z-Image (base): fixed shift 6.0 (no dynamic shifting: `mu` is ignored).
        scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0 if turbo else 6.0, use_dynamic_shifting=False
        )
        return in_eval_mode(
            ZImagePipeline(
                scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
            )
        )

    return build


build_z_image_turbo = _build_z_image(turbo=True)
build_z_image = _build_z_image(turbo=False)


def build_hidream() -> Any:
    """``HiDreamImagePipeline`` like HiDream-ai/HiDream-I1-Full: Long-CLIP L and G (248 positions), T5-XXL,
    Llama 3.1 8B Instruct (all hidden states), the FLUX VAE, a 2x2-patch MoE transformer whose
    ``max_resolution`` 128x128 latents fixes the area every request is rescaled to (1024x1024 px)."""
    import torch
    from diffusers import HiDreamImagePipeline, HiDreamImageTransformer2DModel, UniPCMultistepScheduler
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer(pad_token="!")
    tokenizer_3 = make_t5_tokenizer(512)
    tokenizer_4 = make_llama3_tokenizer()
    text_encoder = _clip_text_long(tokenizer, 32, 32, act="quick_gelu", positions=248, seed=SEED)  # L: 768
    text_encoder_2 = _clip_text_long(tokenizer_2, 64, 64, act="gelu", positions=248, seed=SEED + 3)  # G: 1280
    text_encoder_3 = t5_encoder(tokenizer_3, 64, seed=SEED + 4)
    torch.manual_seed(SEED + 5)
    text_encoder_4 = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer_4),
            hidden_size=32,  # real: 4096
            intermediate_size=64,
            num_hidden_layers=2,  # real: 32
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            bos_token_id=tokenizer_4.bos_token_id,
            eos_token_id=tokenizer_4.eos_token_id,
        )
    ).eval()
    torch.manual_seed(SEED + 1)
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=1,  # real: 16
        num_single_layers=1,  # real: 32
        attention_head_dim=8,  # real: 128
        num_attention_heads=4,  # real: 20
        caption_channels=[64, 32],  # T5's d_model, Llama's hidden size (real: [4096, 4096])
        text_emb_dim=32 + 64,  # CLIP-L + CLIP-G text_embeds (real: 2048)
        num_routed_experts=4,
        num_activated_experts=2,
        axes_dims_rope=(4, 2, 2),  # real: (64, 32, 32); sums to the head dim
        max_resolution=(128, 128),  # real: max_seq 4096 patches (1024x1024 px)
        llama_layers=[0, 1],  # one Llama hidden state per block (real: 48 indices into 32 layers)
    ).eval()
    vae = vae_kl(
        16, 1024, SEED + 2, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False
    )
    # HiDream-I1-Full: flow UniPC, shift 3.0 (Dev / Fast use FlowMatchEulerDiscreteScheduler, shift 6.0 / 3.0).
    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )
    return in_eval_mode(
        HiDreamImagePipeline(
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            text_encoder_3=text_encoder_3,
            tokenizer_3=tokenizer_3,
            text_encoder_4=text_encoder_4,
            tokenizer_4=tokenizer_4,
            transformer=transformer,
        )
    )


def build_hunyuanimage_2_1() -> Any:
    """``HunyuanImagePipeline`` like hunyuanvideo-community/HunyuanImage-2.1-Diffusers: Qwen2.5-VL + ByT5
    (glyph text in quotes), a 32x VAE with 64 latent channels, patch (1, 1), no guidance embedding, and the
    adaptive projected guiders (the guidance scale lives in ``guider``'s config, not in ``__call__``)."""
    import torch
    from diffusers import (
        AdaptiveProjectedMixGuidance,
        AutoencoderKLHunyuanImage,
        FlowMatchEulerDiscreteScheduler,
        HunyuanImagePipeline,
        HunyuanImageTransformer2DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    tokenizer = make_qwen_tokenizer(_QWEN25VL_CHAT_TEMPLATE)
    text_encoder = _qwen25_vl(tokenizer, 32, SEED)
    tokenizer_2 = ByT5Tokenizer()
    torch.manual_seed(SEED + 4)
    text_encoder_2 = T5EncoderModel(  # Glyph-SDXL-v2's ByT5-small encoder (d_model 1472)
        T5Config(
            vocab_size=len(tokenizer_2),
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
            use_cache=False,
            tie_word_embeddings=False,
            pad_token_id=0,
            eos_token_id=1,
        )
    )
    torch.manual_seed(SEED + 1)
    transformer = HunyuanImageTransformer2DModel(
        in_channels=64,
        out_channels=64,
        num_attention_heads=2,  # real: 28
        attention_head_dim=16,  # real: 128
        num_layers=1,  # real: 20
        num_single_layers=1,  # real: 40
        num_refiner_layers=1,  # real: 2
        patch_size=(1, 1),
        guidance_embeds=False,  # the distilled checkpoint has True (distilled_guidance_scale)
        text_embed_dim=32,  # Qwen2.5-VL's hidden size (real: 3584)
        text_embed_2_dim=32,  # ByT5's d_model (real: 1472)
        rope_axes_dim=(8, 8),  # real: (64, 64)
        use_meanflow=False,
    )
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLHunyuanImage(
        in_channels=3,
        out_channels=3,
        latent_channels=64,
        block_out_channels=(32, 32, 32, 32, 32, 128),  # six blocks, five downsamples (real: 128 ... 1024)
        layers_per_block=1,  # real: 2
        spatial_compression_ratio=32,
        sample_size=384,
        scaling_factor=0.75289,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0)
    guider = AdaptiveProjectedMixGuidance(guidance_scale=3.5, adaptive_projected_guidance_start_step=5)
    ocr_guider = AdaptiveProjectedMixGuidance(guidance_scale=3.5, adaptive_projected_guidance_start_step=38)
    return in_eval_mode(
        HunyuanImagePipeline(
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            transformer=transformer,
            guider=guider,
            ocr_guider=ocr_guider,
        )
    )


def build_kandinsky5() -> Any:
    """``Kandinsky5T2IPipeline`` like kandinskylab/Kandinsky-5.0-T2I-Lite-sft-Diffusers: Qwen2.5-VL (its
    processor's tokenizer, see the module docstring) + CLIP-L pooled, the FLUX VAE, a (1, 2, 2)-patch DiT;
    every request is snapped to one of seven ~1 MP resolutions."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky5T2IPipeline, Kandinsky5Transformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = make_qwen_tokenizer(_QWEN25VL_CHAT_TEMPLATE)
    text_encoder = _qwen25_vl(tokenizer, 32, SEED)
    tokenizer_2 = make_clip_tokenizer()
    vocab_2 = tokenizer_2.get_vocab()
    torch.manual_seed(SEED + 3)
    text_encoder_2 = CLIPTextModel(  # openai/clip-vit-large-patch14 (hidden 768); the pipeline reads pooler_output
        CLIPTextConfig(
            vocab_size=len(tokenizer_2),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            projection_dim=32,
            bos_token_id=vocab_2["<|startoftext|>"],
            eos_token_id=vocab_2["<|endoftext|>"],
            pad_token_id=tokenizer_2.pad_token_id,
        )
    )
    torch.manual_seed(SEED + 1)
    transformer = Kandinsky5Transformer3DModel(
        in_visual_dim=16,
        in_text_dim=32,  # Qwen2.5-VL's hidden size (real: 3584)
        in_text_dim2=32,  # CLIP-L's hidden size (real: 768)
        time_dim=16,  # real: 512
        out_visual_dim=16,
        patch_size=(1, 2, 2),
        model_dim=16,  # real: 2560
        ff_dim=32,
        num_text_blocks=1,  # real: 2
        num_visual_blocks=2,  # real: 50
        axes_dims=(2, 2, 4),  # head dim 8 (model_dim / heads of 8): real (16, 24, 24)
        visual_cond=False,
        attention_type="regular",
    )
    vae = vae_kl(
        16, 1024, SEED + 2, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return in_eval_mode(
        Kandinsky5T2IPipeline(
            transformer=transformer,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            scheduler=scheduler,
        )
    )


BUILDS: dict[str, Callable[[], Any]] = {
    "qwen-image": build_qwen_image,
    "z-image-turbo": build_z_image_turbo,
    "z-image": build_z_image,
    "hidream": build_hidream,
    "hunyuanimage-2.1": build_hunyuanimage_2_1,
    "kandinsky5": build_kandinsky5,
}

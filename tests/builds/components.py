"""The pieces several families' builds share: tokenizers learned here from the default model's word
list (CLIP's byte-level BPE, T5's Unigram, Gemma's byte-fallback BPE), CLIP / T5 / Gemma 2 text encoders,
the four-block KL VAEs, SD's noise schedule and the seed every build starts from. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

from pipeline.default_model.architecture import CORPUS, learn_bpe

SEED = 20260101

# The words every tokenizer here learns from: the default model's text-to-image word list.
WORDS: list[str] = list(CORPUS)
_CLIP_MERGES = 400
_GEMMA_MERGES = 300
# Characters every T5/Gemma tokenizer can spell any word with (besides their unknown/byte fallback).
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()[]/&+*=_#%@<>"


# --------------------------------------------------------------------------------------------
# Tokenizers (made locally).


def make_clip_tokenizer(pad_token: str = "<|endoftext|>") -> Any:
    """A byte-level BPE ``CLIPTokenizer`` (model_max_length 77) learned from the word list.

    ``pad_token="!"`` (id 0) is OpenCLIP's choice (SD 2.x, SDXL's and SD3's second tokenizer);
    OpenAI CLIP (SD 1.x, the first tokenizer of SDXL/SD3/FLUX) pads with ``<|endoftext|>``.
    """
    from transformers import CLIPTokenizer

    vocab, merges = learn_bpe(WORDS, _CLIP_MERGES)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token)
    tokenizer.model_max_length = 77
    return tokenizer


def make_t5_tokenizer(model_max_length: int = 512) -> Any:
    """A Unigram ``T5Tokenizer``: <pad>=0, </s>=1, <unk>=2, whole words, then single characters."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    seen = {p for p, _ in pieces}
    for word in sorted(set(WORDS)):
        for piece in ("\u2581" + word, word):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -4.0 - 0.01 * len(pieces)))
    for ch in CHARS:
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
    vocab_list += sorted(set(CHARS) | {"\u2581"} | set("".join(WORDS)))
    merges = _learn_sentencepiece_bpe(WORDS, _GEMMA_MERGES)
    for a, b in merges:
        if a + b not in vocab_list:
            vocab_list.append(a + b)
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=8192)  # pairs
    tokenizer.padding_side = "right"
    return tokenizer


# --------------------------------------------------------------------------------------------
# Text encoders.


def clip_text(tokenizer: Any, hidden: int, projection: int, *, act: str, with_projection: bool, seed: int) -> Any:
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


def t5_encoder(tokenizer: Any, d_model: int, seed: int) -> Any:
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


def gemma2_encoder(tokenizer: Any, seed: int) -> Any:
    """Gemma 2 (gemma-2-2b) shrunk to hidden 32: Sana's, Sana Sprint's and Lumina 2's text encoder."""
    import torch
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(seed)
    return Gemma2Model(
        Gemma2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,  # real: 2304
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


# --------------------------------------------------------------------------------------------
# VAEs: four blocks (8x) with tiny channels.


def vae_kl(latent_channels: int, sample_size: int, seed: int, **extra: Any) -> Any:
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
def vae_sd(sample_size: int, seed: int) -> Any:
    return vae_kl(4, sample_size, seed, scaling_factor=0.18215)


# SDXL's VAE (also PixArt-Sigma's): scaling 0.13025, upcast in fp16.
def vae_sdxl(seed: int) -> Any:
    return vae_kl(4, 1024, seed, scaling_factor=0.13025, force_upcast=True)


# --------------------------------------------------------------------------------------------
# Schedules and modes.


SD_BETAS = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)


def in_eval_mode(pipe: Any) -> Any:
    """Every module in eval mode, as ``from_pretrained`` leaves them (T5's dropout is 0.1, CogView4's transformer
    computes differently in training mode): the in-memory pipeline and its saved-and-loaded copy give the same pixels."""
    import torch

    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe

"""CLIP prompts as AUTOMATIC1111 encodes them: weighted tokens, in chunks of 75, any length (issue 49).

A1111's ``sd_hijack_clip.TextConditionalModel``, step for step, for one CLIP text encoder:

1. **Runs** ``prompt_syntax.weighted``: the text's (text, weight) runs (the syntax parsed, or the
   whole text at weight 1 where it is read as written).
2. **Chunks** ``chunk``: each run's tokens (no start or end token) go into chunks of 75 tokens, each
   token with its run's weight. A chunk that fills up while a comma was written within the last 20
   tokens ends after that comma, and the words after it move to the next chunk (A1111's
   ``comma_padding_backtrack``, 20); ``BREAK`` ends a chunk where it stands. Each chunk becomes 77
   tokens: the start token, its tokens, the end token, then padding (the tokenizer's pad token: the
   end token for SD 1.x, ``!`` for SD 2.x, as A1111's ``id_pad``); padding and the start and end
   tokens weigh 1. An empty text is one chunk.
3. **Encoding** each chunk through the encoder on its own (77 positions, as the encoder was trained),
   the chunks' outputs concatenated along the sequence: n chunks, 77·n positions.
4. **Emphasis** per chunk of one text (A1111's ``sd_emphasis``): "Original" multiplies each position by
   its weight, then scales the chunk back to its mean before weighting; "No norm" only multiplies;
   "None" never sees weights (the text is read as written). A1111 takes the mean over its batch of
   identical prompts; here each text's own, so a prompt's embedding never depends on its batch. (A
   chunk whose weighted mean is about 0, as in the tiny random builds, keeps the product: no inf.)

The texts of one call (each image's prompt and negative prompt) are padded to the same number of
chunks with the empty prompt's chunk (A1111's ``pad_cond_uncond``). A step-level loop keeps each
member at its own count and masks the rest (``loop_sd``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...prompt_syntax import BREAK, plain, weighted

CHUNK = 75  # tokens of text per chunk (77 with the start and end tokens)
COMMA_BACKTRACK = 20  # A1111's comma_padding_backtrack default


@dataclass(frozen=True)
class Chunks:
    """One text's chunks: ``tokens`` and ``weights``, ``count`` rows of 77."""

    tokens: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...]

    @property
    def count(self) -> int:
        return len(self.tokens)


class ClipChunker:
    """Steps 1 and 2 for one CLIP tokenizer (thread-safe only behind the caller's lock: tokenizers
    keep state)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.start = int(tokenizer.bos_token_id)
        self.end = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad = self.end if pad is None else int(pad)
        self.comma = tokenizer.get_vocab().get(",</w>")

    def chunk(self, text: str, syntax: bool) -> Chunks:
        runs = weighted(text, syntax)
        texts = [t for t, w in runs]
        ids = self.tokenizer(texts, truncation=False, add_special_tokens=False).input_ids
        done: list[tuple[list[int], list[float]]] = []
        tokens: list[int] = []
        weights: list[float] = []
        last_comma = -1

        def close() -> None:
            nonlocal tokens, weights, last_comma
            done.append((tokens, weights))
            tokens, weights, last_comma = [], [], -1

        for run_ids, (piece, weight) in zip(ids, runs):
            if piece == BREAK and weight == -1.0:
                close()
                continue
            for token in run_ids:
                if token == self.comma:
                    last_comma = len(tokens)
                elif len(tokens) == CHUNK and last_comma != -1 and len(tokens) - last_comma <= COMMA_BACKTRACK:
                    moved = last_comma + 1
                    carried = tokens[moved:], weights[moved:]
                    tokens, weights = tokens[:moved], weights[:moved]
                    close()
                    tokens, weights = list(carried[0]), list(carried[1])
                if len(tokens) == CHUNK:
                    close()
                tokens.append(int(token))
                weights.append(float(weight))
        if tokens or not done:
            close()
        return Chunks(*zip(*(self._row(t, w) for t, w in done)))

    def _row(self, tokens: list[int], weights: list[float]) -> tuple[tuple[int, ...], tuple[float, ...]]:
        padding = CHUNK - len(tokens)
        return (
            (self.start, *tokens, self.end, *[self.pad] * padding),
            (1.0, *weights, 1.0, *[1.0] * padding),
        )

    def count(self, text: str, syntax: bool) -> int:
        return self.chunk(text, syntax).count


def padded(chunks: Chunks, count: int, empty: Chunks) -> Chunks:
    """``chunks`` with the empty prompt's chunk after it up to ``count`` chunks."""
    more = count - chunks.count
    return Chunks(chunks.tokens + empty.tokens * more, chunks.weights + empty.weights * more)


def encode(
    texts: Sequence[Chunks],
    run: Any,
    emphasis: str,
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 3 and 4 for texts of one chunk count: ([len(texts), 77·count, width], each text's pooled
    embedding from its first chunk, or None). ``run`` maps a [rows, 77] tensor of token ids to the
    encoder's ([rows, 77, width], [rows, pooled] or None), all chunks in one call."""
    count = texts[0].count
    ids = torch.tensor([row for t in texts for row in t.tokens], device=device)
    z, pooled = run(ids)
    z = z.to(dtype=dtype, device=device)  # [texts·count, 77, width]
    if emphasis != "None" and any(w != 1.0 for t in texts for row in t.weights for w in row):
        weights = torch.tensor([row for t in texts for row in t.weights], device=device, dtype=z.dtype)
        z = emphasized(z, weights, emphasis)
    if pooled is not None:  # A1111: the pooled embedding of the first chunk
        pooled = pooled.to(dtype=dtype, device=device).reshape(len(texts), count, -1)[:, 0]
    return z.reshape(len(texts), count * z.shape[1], z.shape[2]), pooled


def emphasized(z: torch.Tensor, weights: torch.Tensor, emphasis: str) -> torch.Tensor:
    """A1111's emphasis over rows of 77 (one per text and chunk): "Original" per row, the mean
    restored; "No norm" the product alone (``encode`` calls it only where a weight is not 1)."""
    weighted_z = z * weights.unsqueeze(-1)
    if emphasis != "Original":
        return weighted_z
    before = z.mean(dim=(1, 2), keepdim=True)
    after = weighted_z.mean(dim=(1, 2), keepdim=True)
    # A chunk whose mean is about 0 (an encoder with no bias after its last norm: the tiny random
    # builds) has no mean to restore: dividing by it gives inf. Such a chunk keeps the product alone.
    restorable = after.abs() > 1e-4 * z.abs().mean(dim=(1, 2), keepdim=True)
    return weighted_z * torch.where(restorable, before / after, torch.ones_like(after))


def runner(text_encoder: Any, end: int, penultimate: bool) -> Any:
    """``encode``'s ``run`` for one CLIP encoder, as the pipeline's own ``encode_prompt`` reads it:
    SD 1.x/2.x its last hidden state (with the tokenizer's attention mask where the encoder's config
    asks for one: the start token to the first end token), no pooled embedding; SDXL (``penultimate``)
    its hidden state before the last layer, and the projected pooled embedding where the encoder has
    a projection (its second encoder)."""
    uses_mask = bool(getattr(text_encoder.config, "use_attention_mask", False))

    def run(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if penultimate:
            out = text_encoder(ids, output_hidden_states=True)
            return out.hidden_states[-2], (out[0] if out[0].ndim == 2 else None)
        mask = None
        if uses_mask:
            first_end = (ids == end).int().argmax(dim=1, keepdim=True)
            mask = (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) <= first_end).long()
        return text_encoder(ids, attention_mask=mask)[0], None

    return run


@dataclass(frozen=True)
class Encoded:
    """A job's texts as its pipeline takes them: the prompts' and (with guidance) the negative
    prompts' embeddings, and SDXL's pooled embeddings (else None)."""

    embeds: torch.Tensor
    negative: torch.Tensor | None
    pooled: torch.Tensor | None = None
    negative_pooled: torch.Tensor | None = None

    def call_arguments(self) -> dict[str, Any]:
        """The pipeline call's arguments (instead of ``prompt`` and ``negative_prompt``)."""
        out: dict[str, Any] = {"prompt_embeds": self.embeds, "negative_prompt_embeds": self.negative}
        if self.pooled is not None:
            out.update(pooled_prompt_embeds=self.pooled, negative_pooled_prompt_embeds=self.negative_pooled)
        return out


class PromptEncoder:
    """A pipeline's CLIP encoders as AUTOMATIC1111 reads them: SD 1.x/2.x's one, SDXL's two (their
    outputs side by side, the pooled embedding from the second, as the pipeline's ``encode_prompt``).
    Model thread only (``chunkers`` for counting are the caller's own copies)."""

    def __init__(self, pipe: Any, family: str) -> None:
        self.pipe = pipe
        self.sdxl = family == "sdxl"
        pairs = [("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2")] if self.sdxl else [
            ("tokenizer", "text_encoder")]  # fmt: skip
        self.encoders = [
            (ClipChunker(getattr(pipe, t)), getattr(pipe, e))
            for t, e in pairs
            if getattr(pipe, t, None) is not None and getattr(pipe, e, None) is not None
        ]
        self.chunker = self.encoders[0][0]
        # SDXL zeroes an all-empty negative prompt (``force_zeros_for_empty_prompt``), as its pipeline does
        self.zero_empty = self.sdxl and bool(getattr(pipe.config, "force_zeros_for_empty_prompt", False))
        self._empty = [chunker.chunk("", False) for chunker, _ in self.encoders]

    def encode(
        self, prompts: Sequence[str], negatives: Sequence[str] | None, emphasis: str, device: torch.device
    ) -> Encoded:
        """The prompts (and ``negatives``, where guidance runs), every text padded to one chunk count, on
        the pipeline's execution ``device`` (the caller's, read once: diffusers walks every module's hooks
        to find it, 0.7 ms of a 3 ms encode on the embedded model)."""
        syntax = emphasis != "None"
        texts = [*prompts, *(negatives or ())]
        per_encoder = [[chunker.chunk(t or "", syntax) for t in texts] for chunker, _ in self.encoders]
        count = max(c.count for chunks in per_encoder for c in chunks)
        outputs, pooled = [], None
        for (chunker, encoder), chunks, empty in zip(self.encoders, per_encoder, self._empty):
            run = runner(encoder, chunker.end, penultimate=self.sdxl)
            z, own_pooled = encode([padded(c, count, empty) for c in chunks], run, emphasis, device, encoder.dtype)
            outputs.append(z)
            pooled = own_pooled if own_pooled is not None else pooled
        embeds = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]
        n = len(prompts)
        if negatives is None:
            return Encoded(embeds, None, pooled[:n] if pooled is not None else None)
        negative, negative_pooled = embeds[n:], (pooled[n:] if pooled is not None else None)
        if self.zero_empty and not any(negatives):
            negative = torch.zeros_like(negative)
            negative_pooled = torch.zeros_like(negative_pooled) if negative_pooled is not None else None
        return Encoded(embeds[:n], negative, pooled[:n] if pooled is not None else None, negative_pooled)


def t5_row(tokenizer: Any, text: str, syntax: bool, length: int) -> tuple[list[int], list[float]]:
    """One prompt as FLUX.1's T5 reads it, weighted: each run's tokens with its weight, cut to leave
    room for the end token, then the end token and padding to ``length`` (weight 1). A plain prompt
    gives the very ids the pipeline's own tokenizer call does; a ``BREAK`` is a space (T5 has no chunks)."""
    runs = [(t, w) for t, w in weighted(text, syntax) if not (t == BREAK and w == -1.0)]
    ids = tokenizer([t for t, _ in runs], truncation=False, add_special_tokens=False).input_ids
    tokens = [int(i) for run_ids in ids for i in run_ids][: length - 1]
    weights = [float(w) for run_ids, (_, w) in zip(ids, runs) for _ in run_ids][: length - 1]
    padding = length - 1 - len(tokens)
    return ([*tokens, int(tokenizer.eos_token_id), *[int(tokenizer.pad_token_id)] * padding],
            [*weights, 1.0, *[1.0] * padding])  # fmt: skip


def flux_encode(
    pipe: Any, prompts: Sequence[str], emphasis: str, device: torch.device, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FLUX.1's texts as its ``encode_prompt`` gives them (T5 embeddings, CLIP pooled, text ids), with
    A1111's syntax read: CLIP (pooled only) reads the words with the syntax removed; T5 weighs each
    token by ComfyUI's rule, which FLUX's front ends share: ``empty + (z - empty) × weight``, ``empty``
    the empty prompt's encoding at that position (no mean to restore). "None": the text as written."""
    syntax = emphasis != "None"
    pooled = pipe._get_clip_prompt_embeds(prompt=[plain(p) if syntax else p for p in prompts], device=device)
    rows = [t5_row(pipe.tokenizer_2, p, syntax, length) for p in prompts]
    weighted_any = any(w != 1.0 for _, weights in rows for w in weights)
    if weighted_any:
        rows.append(t5_row(pipe.tokenizer_2, "", False, length))
    encoder = pipe.text_encoder_2
    ids = torch.tensor([tokens for tokens, _ in rows], device=device)
    z = encoder(ids, output_hidden_states=False)[0].to(dtype=encoder.dtype, device=device)
    if weighted_any:
        z, empty = z[:-1], z[-1:]
        weights = torch.tensor([w for _, w in rows[:-1]], device=device, dtype=z.dtype).unsqueeze(-1)
        z = torch.where(weights == 1.0, z, empty + (z - empty) * weights)  # weight 1: the encoding itself
    dtype = pipe.text_encoder.dtype if pipe.text_encoder is not None else pipe.transformer.dtype
    text_ids = torch.zeros(z.shape[1], 3).to(device=device, dtype=dtype)
    return z, pooled, text_ids

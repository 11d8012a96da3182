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
member at its own count and masks the rest (``loop_sd``); SD3's joint attention takes no text mask, so
its loops are keyed by the chunk count instead (``fields.CHUNK_KEYED``).

T5 (FLUX.1's and SD3's) is weighted by ComfyUI's rule, which these families' front ends share
(``t5_weighted``): each token ``empty + (z - empty) × weight``, ``empty`` the empty prompt's encoding
at that position, up to the pipeline's own ``max_sequence_length`` (no chunks; ``BREAK`` is a space).
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

    def with_t5(self, t5: torch.Tensor) -> Encoded:
        """SD3: the CLIP embeddings padded with zeros to T5's width, then T5's rows after them on the
        sequence (its ``encode_prompt``); ``t5`` holds the prompts' rows, then the negatives'."""
        n = self.embeds.shape[0]

        def joined(clip: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            clip = torch.nn.functional.pad(clip, (0, rows.shape[-1] - clip.shape[-1]))
            return torch.cat([clip, rows], dim=-2)

        negative = joined(self.negative, t5[n:]) if self.negative is not None else None
        return Encoded(joined(self.embeds, t5[:n]), negative, self.pooled, self.negative_pooled)

    def call_arguments(self) -> dict[str, Any]:
        """The pipeline call's arguments (instead of ``prompt`` and ``negative_prompt``)."""
        out: dict[str, Any] = {"prompt_embeds": self.embeds, "negative_prompt_embeds": self.negative}
        if self.pooled is not None:
            out.update(pooled_prompt_embeds=self.pooled, negative_pooled_prompt_embeds=self.negative_pooled)
        return out


class PromptEncoder:
    """A pipeline's CLIP encoders as AUTOMATIC1111 reads them: SD 1.x/2.x's one, SDXL's and SD3's two
    (their penultimate layers side by side; the pooled embedding SDXL's second's, SD3's both side by
    side, as each pipeline's ``encode_prompt``). Model thread only (``chunkers`` for counting are the
    caller's own copies)."""

    def __init__(self, pipe: Any, family: str) -> None:
        self.pipe = pipe
        self.sdxl = family in ("sdxl", "sd3")  # two CLIPs, their penultimate layers
        self.pool_both = family == "sd3"
        pairs = [("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2")] if self.sdxl else [
            ("tokenizer", "text_encoder")]  # fmt: skip
        self.encoders = [
            (ClipChunker(getattr(pipe, t)), getattr(pipe, e))
            for t, e in pairs
            if getattr(pipe, t, None) is not None and getattr(pipe, e, None) is not None
        ]
        self.chunker = self.encoders[0][0]
        # SDXL zeroes an all-empty negative prompt (``force_zeros_for_empty_prompt``), as its pipeline does
        self.zero_empty = family == "sdxl" and bool(getattr(pipe.config, "force_zeros_for_empty_prompt", False))
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
        outputs, pools = [], []
        dtype = self.encoders[0][1].dtype  # SD3 casts both CLIPs' outputs to the first's
        for (chunker, encoder), chunks, empty in zip(self.encoders, per_encoder, self._empty):
            run = runner(encoder, chunker.end, penultimate=self.sdxl)
            own_dtype = dtype if self.pool_both else encoder.dtype
            z, own_pooled = encode([padded(c, count, empty) for c in chunks], run, emphasis, device, own_dtype)
            outputs.append(z)
            if own_pooled is not None:
                pools.append(own_pooled)
        embeds = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]
        pooled = (torch.cat(pools, dim=-1) if self.pool_both else pools[-1]) if pools else None
        n = len(prompts)
        if negatives is None:
            return Encoded(embeds, None, pooled[:n] if pooled is not None else None)
        negative, negative_pooled = embeds[n:], (pooled[n:] if pooled is not None else None)
        if self.zero_empty and not any(negatives):
            negative = torch.zeros_like(negative)
            negative_pooled = torch.zeros_like(negative_pooled) if negative_pooled is not None else None
        return Encoded(embeds[:n], negative, pooled[:n] if pooled is not None else None, negative_pooled)


def t5_row(tokenizer: Any, text: str, syntax: bool, length: int) -> tuple[list[int], list[float]]:
    """One prompt as T5 reads it (FLUX.1's, SD3's), weighted: each run's tokens with its weight, cut to leave
    room for the end token, then the end token and padding to ``length`` (weight 1). A plain prompt
    gives the very ids the pipeline's own tokenizer call does; a ``BREAK`` is a space (T5 has no chunks)."""
    runs = [(t, w) for t, w in weighted(text, syntax) if not (t == BREAK and w == -1.0)]
    ids = tokenizer([t for t, _ in runs], truncation=False, add_special_tokens=False).input_ids
    tokens = [int(i) for run_ids in ids for i in run_ids][: length - 1]
    weights = [float(w) for run_ids, (_, w) in zip(ids, runs) for _ in run_ids][: length - 1]
    padding = length - 1 - len(tokens)
    return ([*tokens, int(tokenizer.eos_token_id), *[int(tokenizer.pad_token_id)] * padding],
            [*weights, 1.0, *[1.0] * padding])  # fmt: skip


def t5_weighted(
    tokenizer: Any, encoder: Any, texts: Sequence[str], syntax: bool, device: torch.device, length: int
) -> torch.Tensor:
    """T5's embeddings of ``texts`` at ``length`` tokens (the pipeline's ``max_sequence_length``),
    weighted by ComfyUI's rule: ``empty + (z - empty) × weight``, ``empty`` the empty prompt's encoding
    at that position (no mean to restore). A plain text gives the pipeline's own ids and tensor."""
    rows = [t5_row(tokenizer, t, syntax, length) for t in texts]
    weighted_any = any(w != 1.0 for _, weights in rows for w in weights)
    if weighted_any:
        rows.append(t5_row(tokenizer, "", False, length))
    ids = torch.tensor([tokens for tokens, _ in rows], device=device)
    z = encoder(ids, output_hidden_states=False)[0].to(dtype=encoder.dtype, device=device)
    if weighted_any:
        z, empty = z[:-1], z[-1:]
        weights = torch.tensor([w for _, w in rows[:-1]], device=device, dtype=z.dtype).unsqueeze(-1)
        z = torch.where(weights == 1.0, z, empty + (z - empty) * weights)  # weight 1: the encoding itself
    return z


def flux_encode(
    pipe: Any, prompts: Sequence[str], emphasis: str, device: torch.device, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FLUX.1's texts as its ``encode_prompt`` gives them (T5 embeddings, CLIP pooled, text ids), with
    A1111's syntax read: CLIP (pooled only) reads the words with the syntax removed; T5 weighs each
    token by ComfyUI's rule (``t5_weighted``). "None": the text as written."""
    syntax = emphasis != "None"
    pooled = pipe._get_clip_prompt_embeds(prompt=[plain(p) if syntax else p for p in prompts], device=device)
    z = t5_weighted(pipe.tokenizer_2, pipe.text_encoder_2, prompts, syntax, device, length)
    dtype = pipe.text_encoder.dtype if pipe.text_encoder is not None else pipe.transformer.dtype
    text_ids = torch.zeros(z.shape[1], 3).to(device=device, dtype=dtype)
    return z, pooled, text_ids


def sd3_encode(
    clip: PromptEncoder,
    prompts: Sequence[str],
    negatives: Sequence[str] | None,
    emphasis: str,
    device: torch.device,
    length: int,
) -> Encoded:
    """SD3's texts as its ``encode_prompt`` lays them out, with A1111's syntax read: CLIP-L and CLIP-G
    in chunks and weighted (``clip``, "No norm" by default), T5 by ComfyUI's rule at ``length`` tokens
    (zeros where the pipeline has no T5, as its own call gives)."""
    encoded = clip.encode(prompts, negatives, emphasis, device)
    pipe, texts = clip.pipe, [*prompts, *(negatives or ())]
    if getattr(pipe, "text_encoder_3", None) is None:
        width = pipe.transformer.config.joint_attention_dim
        t5 = torch.zeros(len(texts), length, width, device=device, dtype=pipe.text_encoder.dtype)
    else:
        t5 = t5_weighted(pipe.tokenizer_3, pipe.text_encoder_3, texts, emphasis != "None", device, length)
    return encoded.with_t5(t5)

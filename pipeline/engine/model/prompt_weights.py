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

from ...prompt_syntax import BREAK, weighted

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
) -> torch.Tensor:
    """Steps 3 and 4 for texts of one chunk count: [len(texts), 77·count, width]. ``run`` maps a
    [rows, 77] tensor of token ids to the encoder's [rows, 77, width] output (all chunks in one call)."""
    count = texts[0].count
    ids = torch.tensor([row for t in texts for row in t.tokens], device=device)
    z = run(ids).to(dtype=dtype, device=device)  # [texts·count, 77, width]
    if emphasis != "None":
        weights = torch.tensor([row for t in texts for row in t.weights], device=device, dtype=z.dtype)
        z = emphasized(z, weights, count, emphasis)
    return z.reshape(len(texts), count * z.shape[1], z.shape[2])


def emphasized(z: torch.Tensor, weights: torch.Tensor, count: int, emphasis: str) -> torch.Tensor:
    """A1111's emphasis over rows of 77 (``count`` rows per text): "Original" per text and chunk,
    the mean restored; "No norm" the product alone. All weights 1: ``z`` itself."""
    if bool((weights == 1.0).all()):
        return z
    weighted_z = z * weights.unsqueeze(-1)
    if emphasis != "Original":
        return weighted_z
    before = z.mean(dim=(1, 2), keepdim=True)
    after = weighted_z.mean(dim=(1, 2), keepdim=True)
    # A chunk whose mean is about 0 (an encoder with no bias after its last norm: the tiny random
    # builds) has no mean to restore: dividing by it gives inf. Such a chunk keeps the product alone.
    restorable = after.abs() > 1e-4 * z.abs().mean(dim=(1, 2), keepdim=True)
    return weighted_z * torch.where(restorable, before / after, torch.ones_like(after))


def sd_runner(text_encoder: Any, end: int) -> Any:
    """``encode``'s ``run`` for SD 1.x/2.x: the encoder's last hidden state, as the pipeline's own
    ``encode_prompt`` takes it; where the encoder's config asks for an attention mask, the tokenizer's
    (the start token to the first end token)."""
    uses_mask = bool(getattr(text_encoder.config, "use_attention_mask", False))

    def run(ids: torch.Tensor) -> torch.Tensor:
        mask = None
        if uses_mask:
            first_end = (ids == end).int().argmax(dim=1, keepdim=True)
            mask = (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) <= first_end).long()
        return text_encoder(ids, attention_mask=mask)[0]

    return run

"""Whether a prompt fits its text encoders' windows, and the note for one that does not. Pure.

``request`` asks: ``fits_every_window`` answers without counting (most prompts are short enough),
and ``truncation_notes`` words the note for each encoder that cuts a counted text.
"""

from __future__ import annotations

from typing import Mapping


def fits_every_window(text: str, encoders: tuple[tuple[str, int], ...]) -> bool:
    """Whether ``text`` is surely within every text encoder's window, without counting its tokens.

    Every tokenizer of these model families spends at least one character of an ASCII text on each
    token: CLIP's byte-level BPE, and T5's and Gemma's SentencePiece, whose one exception is the
    word marker it puts before the first word. So an ASCII text of n characters is at most n + 1
    tokens (``tests/unit/test_request.py`` checks it on each family's tokenizer). Counting a prompt
    costs a round trip to the model process; most prompts are short enough to need none.
    A ByT5 glyph encoder (HunyuanImage) reads the quoted text formatted as ``Text "...". ``: at
    most five bytes for each character of the prompt (an empty ``""`` becomes ten), so its window
    counts a fifth.
    """
    windows = [limit // 5 if name == "ByT5" else limit for name, limit in encoders]
    return bool(encoders) and text.isascii() and len(text) + 1 <= min(windows)


def truncation_notes(field: str, tokens: Mapping[str, int], encoders: tuple[tuple[str, int], ...]) -> list[str]:
    """One note per text encoder that cut the text, naming it (CLIP reads 75 tokens, T5 its own length)."""
    notes = []
    for encoder, limit in dict(encoders).items():
        if (n := tokens.get(encoder, 0)) > limit:
            others = [f"{e} reads up to {lim}" for e, lim in dict(encoders).items() if e != encoder and lim >= n]
            rest = f" ({'; '.join(others)})" if others else ""
            what = f"{field}'s quoted text" if encoder == "ByT5" else field  # the glyphs HunyuanImage draws
            notes.append(
                f"{what} is {n} tokens; the {encoder} text encoder reads the first {limit}, "
                f"so it ignored the rest{rest}"
            )
    return notes

"""AUTOMATIC1111's prompt syntax (issue 49): ``(x)``, ``[x]``, ``(x:w)``, escapes and ``BREAK``. Free of torch.

``parse`` is A1111's ``prompt_parser.parse_prompt_attention``, rule for rule: ``(x)`` multiplies the
weight of what it holds by 1.1, ``[x]`` divides it by 1.1, ``(x:w)`` multiplies it by ``w``, nesting
multiplies, ``\\(`` ``\\)`` ``\\[`` ``\\]`` ``\\\\`` are the characters themselves, an unclosed bracket
applies to the end, and ``BREAK`` (a word in capitals) starts a new chunk of the CLIP encoding. The
result is a list of (text, weight) runs, neighbours of one weight merged; a ``BREAK`` is the run
``("BREAK", -1.0)``. Two deviations: a weight that is not a number (``(x:.)``) leaves the text as
it is (A1111 raises), and a bracket opened while ``MAX_OPEN`` are open is text (A1111 weighs it:
1.1 ** 33 and beyond), which keeps the parse linear in the prompt.

How a family reads the runs (``engine.model.prompt_weights``, ``docs/families.md``): CLIP encoders
weight each token by its run's weight (``emphasis``); other encoders read ``plain``, the text with
the syntax removed. ``emphasis`` "None" (A1111's option of that name) and the server's
``--prompt-syntax plain`` read the prompt as it was written: brackets and all, no ``BREAK``.
"""

from __future__ import annotations

import re
from typing import Any

SYNTAXES = ("a1111", "plain")  # ``--prompt-syntax``
BREAK = "BREAK"
Run = tuple[str, float]

_ATTENTION = re.compile(
    r"""
\\\(|
\\\)|
\\\[|
\\]|
\\\\|
\\|
\(|
\[|
:\s*([+-]?[.\d]+)\s*\)|
\)|
]|
[^\\()\[\]:]+|
:
""",
    re.X,
)
_BREAK = re.compile(r"\bBREAK\b")
_ROUND, _SQUARE = 1.1, 1 / 1.1
# Brackets open at once at most (1.1 ** 32 is 21x): each run is weighted at most this many times, so
# the parse is linear in the prompt (A1111's is quadratic in its brackets: 13 ms at 2,000 characters).
MAX_OPEN = 32


def parse(text: str) -> list[Run]:
    """``text`` as A1111 weighs it: (text, weight) runs (see the module docstring).

    A1111 multiplies every run from a bracket's opening on at its close (and the unclosed ones at the
    end): quadratic in the brackets. Here each bracket is a range of runs with its multiplier, and
    one sweep multiplies each run by the ranges that cover it (at most ``MAX_OPEN`` at once)."""
    runs: list[list[Any]] = []
    round_open: list[int] = []
    square_open: list[int] = []
    ranges: list[tuple[int, int, float]] = []  # (first run, past the last run, multiplier)

    for match in _ATTENTION.finditer(text):
        piece, weight = match.group(0), match.group(1)
        if piece.startswith("\\"):
            runs.append([piece[1:], 1.0])
        elif piece in ("(", "[") and len(round_open) + len(square_open) >= MAX_OPEN:
            runs.append([piece, 1.0])  # past the depth A1111's weights mean anything: the bracket as text
        elif piece == "(":
            round_open.append(len(runs))
        elif piece == "[":
            square_open.append(len(runs))
        elif weight is not None and round_open and _is_number(weight):
            ranges.append((round_open.pop(), len(runs), float(weight)))
        elif piece == ")" and round_open:
            ranges.append((round_open.pop(), len(runs), _ROUND))
        elif piece == "]" and square_open:
            ranges.append((square_open.pop(), len(runs), _SQUARE))
        else:
            for i, part in enumerate(_breaks(piece)):
                if i > 0:
                    runs.append([BREAK, -1.0])
                runs.append([part, 1.0])
    ranges += [(start, len(runs), _ROUND) for start in round_open]
    ranges += [(start, len(runs), _SQUARE) for start in square_open]
    _weigh(runs, ranges)
    if not runs:
        runs = [["", 1.0]]
    merged: list[tuple[list[str], float]] = [([runs[0][0]], runs[0][1])]
    for text_of, weight_of in runs[1:]:
        pieces, last = merged[-1]
        if weight_of == last and weight_of != -1.0:
            pieces.append(text_of)  # joined once below: concatenating one by one is quadratic
        else:
            merged.append(([text_of], weight_of))
    return [("".join(pieces), float(w)) for pieces, w in merged]


def _weigh(runs: list[list[Any]], ranges: list[tuple[int, int, float]]) -> None:
    """Each run's weight times the multipliers of the ranges that cover it, in the order they closed."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for k, (start, end, _) in enumerate(ranges):
        if start < end:
            starts.setdefault(start, []).append(k)
            ends.setdefault(end, []).append(k)
    active: set[int] = set()
    factor = 1.0
    for i, run in enumerate(runs):
        if i in starts or i in ends:
            active.difference_update(ends.get(i, ()))
            active.update(starts.get(i, ()))
            factor = 1.0
            for k in sorted(active):  # close order: A1111's order of multiplication
                factor *= ranges[k][2]
        if active:
            run[1] *= factor


def _breaks(piece: str) -> list[str]:
    """``piece`` split at each word ``BREAK`` with the whitespace around it, as A1111's pattern (any
    whitespace, the word, any whitespace) splits it, in linear time: that pattern backtracks over
    every run of whitespace at every position (2,000 spaces: 0.1 s); this splits on the word and strips."""
    if BREAK not in piece:
        return [piece]
    parts = _BREAK.split(piece)
    last = len(parts) - 1
    if last == 0:
        return parts
    return [part.rstrip() if i == 0 else part.lstrip() if i == last else part.strip() for i, part in enumerate(parts)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def plain(text: str) -> str:
    """``text`` with the syntax removed, for encoders that take no weights (T5, LLMs): the words kept,
    brackets and weights gone, a ``BREAK`` a space. A text without syntax comes back as it is."""
    if not has_syntax(text):
        return text
    words = "".join(" " if w == -1.0 else t for t, w in parse(text))
    return re.sub(r"  +", " ", words).strip()


def has_syntax(text: str) -> bool:
    """Whether ``text`` holds anything ``parse`` reads as syntax (a bracket, a backslash, ``BREAK``)."""
    return any(c in text for c in "()[]\\") or BREAK in text


def weighted(text: str, syntax: bool) -> list[Run]:
    """The runs a CLIP encoder weighs: ``parse`` where the syntax is read, else the text at weight 1."""
    return parse(text) if syntax and has_syntax(text) else [(text, 1.0)]

"""AUTOMATIC1111's prompt syntax (issue 49): ``(x)``, ``[x]``, ``(x:w)``, escapes and ``BREAK``. Free of torch.

``parse`` is A1111's ``prompt_parser.parse_prompt_attention``, rule for rule: ``(x)`` multiplies the
weight of what it holds by 1.1, ``[x]`` divides it by 1.1, ``(x:w)`` multiplies it by ``w``, nesting
multiplies, ``\\(`` ``\\)`` ``\\[`` ``\\]`` ``\\\\`` are the characters themselves, an unclosed bracket
applies to the end, and ``BREAK`` (a word in capitals) starts a new chunk of the CLIP encoding. The
result is a list of (text, weight) runs, neighbours of one weight merged; a ``BREAK`` is the run
``("BREAK", -1.0)``. One deviation, where A1111 fails: a weight that is not a number (``(x:.)``)
leaves the text as it is instead of raising.

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
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)
_ROUND, _SQUARE = 1.1, 1 / 1.1


def parse(text: str) -> list[Run]:
    """``text`` as A1111 weighs it: (text, weight) runs (see the module docstring)."""
    runs: list[list[Any]] = []
    round_open: list[int] = []
    square_open: list[int] = []

    def multiply(start: int, by: float) -> None:
        for run in runs[start:]:
            run[1] *= by

    for match in _ATTENTION.finditer(text):
        piece, weight = match.group(0), match.group(1)
        if piece.startswith("\\"):
            runs.append([piece[1:], 1.0])
        elif piece == "(":
            round_open.append(len(runs))
        elif piece == "[":
            square_open.append(len(runs))
        elif weight is not None and round_open and _is_number(weight):
            multiply(round_open.pop(), float(weight))
        elif piece == ")" and round_open:
            multiply(round_open.pop(), _ROUND)
        elif piece == "]" and square_open:
            multiply(square_open.pop(), _SQUARE)
        else:
            for i, part in enumerate(_BREAK.split(piece)):
                if i > 0:
                    runs.append([BREAK, -1.0])
                runs.append([part, 1.0])
    for start in round_open:
        multiply(start, _ROUND)
    for start in square_open:
        multiply(start, _SQUARE)
    if not runs:
        runs = [["", 1.0]]
    merged: list[list[Any]] = [runs[0]]
    for run in runs[1:]:
        last = merged[-1]
        if run[1] == last[1] and run[1] != -1.0:
            last[0] += run[0]
        else:
            merged.append(run)
    return [(str(t), float(w)) for t, w in merged]


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

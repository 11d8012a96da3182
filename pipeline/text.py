"""Text as the app takes it, in every text field of every event: valid Unicode, no control characters.

A string from JSON may hold what no encoder can write: a lone surrogate (``"\\ud800"``) passes
Python's JSON reader and then fails deep inside a tokenizer, as a server fault. So every text is
checked where it enters (the front door for every event, ``request.validate`` for ``/generate``):

- it must encode as UTF-8 (no unpaired surrogate), else it is refused, naming the field;
- a carriage return is a line break: ``\\r\\n`` and ``\\r`` become ``\\n``;
- any other control character but newline and tab (C0, DEL, C1) is refused, naming the field and
  the character, since it is never part of a prompt a person wrote.

Pure functions, no imports of the app.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_RETURNS = re.compile(r"\r\n?")


def text_problem(value: str) -> str | None:
    """Why ``value`` is not text the app takes (to follow the field's name), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"must be valid Unicode text (an unpaired surrogate at character {exc.start + 1})"
    control = _CONTROL.search(_RETURNS.sub("\n", value))
    if control is not None:
        char = control.group()
        return (
            f"must not contain control characters (U+{ord(char):04X} at character {control.start() + 1}); "
            "line breaks and tabs are fine"
        )
    return None


def normalized(value: str) -> str:
    """``value`` with every carriage return written as a newline (the one change made to a text)."""
    return _RETURNS.sub("\n", value) if "\r" in value else value

"""The one error type bad input turns into: it names the file, the field and what was wrong.

The CLI prints ``str(error)`` on one line and exits with status 2; the dashboard shows the same text.
Whatever a hostile file puts into a key or a value, ``str(error)`` is one line (control characters
escaped) of at most ``MAX_CHARS`` characters.
"""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
    """Bad input: a malformed file, an unknown key, a wrong type, an impossible setting, a bad trace row."""

    def __init__(self, message: str, *, file: str | Path | None = None, field: str | None = None) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        return one_line(": ".join([*parts, self.message]))


def did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or nothing when none is close."""
    import difflib  # only bad input pays for it (about a millisecond of start-up otherwise)

    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


MAX_CHARS = 1500
"""Longest error text: room for a list of every shipped profile, never a whole file."""


def one_line(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` with control characters escaped (a newline becomes ``\\n``), cut to ``limit`` characters."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"

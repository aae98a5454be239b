"""The one error type bad input turns into: it names the file, the field and what was wrong.

The CLI prints ``str(error)`` on one line and exits with status 2; the dashboard shows the same text.
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
        return ": ".join([*parts, self.message])

"""Readers for the public LLM-serving traces fleetsim replays (see shared/data/traces/README.md).

Each reader turns one file format into the same columns: arrival time in seconds from the first row
(absent for length-only traces), prompt tokens, output tokens and, for Mooncake, the per-512-token prefix
block ids. A row that does not parse is a ``ConfigError`` naming the file, the line and the column, so a
user can open the file at that line; nothing is silently skipped except blank lines.

This module only reads: it never invents arrivals, clamps lengths or hashes blocks
(``generate``, ``trace_replay`` and ``block_keys`` do).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.errors import ConfigError
from simulator.workload.trace_sources import TRACES_TOKEN as TRACES_TOKEN
from simulator.workload.trace_sources import missing_hint, resolve_trace_path
from simulator.workload.trace_sources import traces_dir as traces_dir

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry (FAST'25 release, checked on both shipped files)."""

if TYPE_CHECKING:
    import pandas as pd


class TraceFormat(StrEnum):
    AZURE = "azure"
    """Azure LLM inference trace 2023/2024 CSV: TIMESTAMP, ContextTokens, GeneratedTokens."""
    MOONCAKE = "mooncake"
    """Mooncake FAST'25 JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""
    VIDUR = "vidur"
    """Vidur processed-trace CSV: num_prefill_tokens, num_decode_tokens; lengths only, no timestamps."""


@dataclass(frozen=True, slots=True)
class TraceRows:
    """One trace file as columns, in file order."""

    arrival_s: np.ndarray | None
    """float64 seconds from the earliest row's timestamp (the first's in a sorted trace); None when the
    format has no timestamps."""
    prompt_tokens: np.ndarray
    """int64 prompt lengths as written (may be 0: callers clamp)."""
    output_tokens: np.ndarray
    """int64 output lengths as written (may be 0: callers clamp)."""
    hash_id_values: np.ndarray | None = None
    """int64 Mooncake block ids of all rows, concatenated; None for formats without prefix information."""
    hash_id_offsets: np.ndarray | None = None
    """int64, len(rows) + 1: row i's ids are ``hash_id_values[offsets[i]:offsets[i + 1]]``."""

    def __len__(self) -> int:
        return len(self.prompt_tokens)


QUOTE_CHARS = 24
"""A bad value is quoted in an error at most this long: enough to find it, never a file's contents."""


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with an ellipsis), for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load_trace(trace_format: TraceFormat | str, path: str | Path, *, max_rows: int | None = None) -> TraceRows:
    """Read a trace file into columns; ``max_rows`` stops after that many data rows."""
    file = resolve_trace_path(path)
    if not file.is_file():
        raise ConfigError(f"trace file not found{missing_hint(file)}", file=file)
    try:
        match TraceFormat(trace_format):
            case TraceFormat.AZURE:
                return _read_azure(file, max_rows)
            case TraceFormat.MOONCAKE:
                return _read_mooncake(file, max_rows)
            case TraceFormat.VIDUR:
                return _read_vidur(file, max_rows)
    except UnicodeDecodeError as err:
        raise ConfigError(f"not UTF-8 text (byte {err.start} of a read block): a trace is a text file",
                          file=file) from None


def read_trace(trace_format: TraceFormat | str, path: str | Path, *, max_rows: int | None = None) -> pd.DataFrame:
    """A trace as a DataFrame for exploration: arrival_s (NaN without timestamps), prompt_tokens,
    output_tokens, and hash_ids (lists of 512-token block ids) for Mooncake."""
    rows = load_trace(trace_format, path, max_rows=max_rows)
    arrival = rows.arrival_s if rows.arrival_s is not None else np.full(len(rows), np.nan)
    import pandas as pd  # not at import: the simulator reads traces without it (this is for notebooks)

    frame = pd.DataFrame(
        {"arrival_s": arrival, "prompt_tokens": rows.prompt_tokens, "output_tokens": rows.output_tokens}
    )
    if rows.hash_id_values is not None and rows.hash_id_offsets is not None:
        values = rows.hash_id_values.tolist()
        bounds = rows.hash_id_offsets.tolist()
        frame["hash_ids"] = [values[a:b] for a, b in itertools.pairwise(bounds)]
    return frame


# --- CSV formats -------------------------------------------------------------------------------------


def _checked(reader: Any, file: Path) -> Iterator[list[str]]:
    """The reader's rows; a row the csv module cannot split (a field past its size limit, a NUL) is one
    ``ConfigError`` naming the line."""
    while True:
        try:
            values: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise ConfigError(f"line {reader.line_num}: not a CSV row ({err})", file=file) from None
        yield values


def _csv_rows(file: Path, columns: Sequence[str], max_rows: int | None) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number, values of ``columns``) per data row; the header must name every column."""
    with file.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(_checked(reader, file), None)
        if header is None:
            raise ConfigError("empty file: expected a header row", file=file)
        names = [name.strip() for name in header]
        missing = [c for c in columns if c not in names]
        if missing:
            raise ConfigError(f"line 1: header lacks column(s) {missing} (it has {len(names)} columns)", file=file)
        positions = [names.index(c) for c in columns]
        count = 0
        for values in _checked(reader, file):
            if not values or all(not v.strip() for v in values):
                continue  # blank line: nothing to parse
            if max_rows is not None and count >= max_rows:
                return
            if len(values) != len(names):
                raise ConfigError(
                    f"line {reader.line_num}: expected {len(names)} fields, found {len(values)}", file=file
                )
            yield reader.line_num, [values[p] for p in positions]
            count += 1


MAX_TOKENS = 1 << 24
"""Most tokens one prompt or answer may have, in a trace row or drawn from a length distribution (16.8 M,
past every model's context): a length beyond it is a broken input, and would only make the simulator
allocate for it."""


def _parse_tokens(text: str, *, file: Path, line: int, column: str) -> int:
    """A token count: a non-negative whole number (``12`` or ``12.0``, as pandas sometimes writes it)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or not value.is_integer():
        raise ConfigError(
            f"line {line}: expected a non-negative whole number of tokens, got {quoted(text)}",
            file=file,
            field=column,
        )
    if value > MAX_TOKENS:
        raise ConfigError(f"line {line}: {value:.0f} tokens is more than any model's context "
                          f"(at most {MAX_TOKENS:,} per request)", file=file, field=column)
    return int(value)


def _parse_azure_time(text: str, *, file: Path, line: int, column: str) -> datetime:
    """Azure writes ``YYYY-MM-DD HH:MM:SS.fffffff``; fromisoformat reads it (and the ISO variants)."""
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"line {line}: expected a timestamp like 2023-11-16 18:17:03.9799600, got {quoted(text)}",
            file=file,
            field=column,
        ) from None


def _read_azure(file: Path, max_rows: int | None) -> TraceRows:
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    first: datetime | None = None
    for line, (stamp, context, generated) in _csv_rows(file, columns, max_rows):
        moment = _parse_azure_time(stamp, file=file, line=line, column=columns[0])
        if first is None:
            first = moment
        try:
            times.append((moment - first).total_seconds())
        except TypeError:  # one row with a UTC offset, another without: not comparable
            raise ConfigError(
                f"line {line}: timestamp {quoted(stamp)} mixes time zones with the first row",
                file=file,
                field=columns[0],
            ) from None
        prompts.append(_parse_tokens(context, file=file, line=line, column=columns[1]))
        outputs.append(_parse_tokens(generated, file=file, line=line, column=columns[2]))
    _require_rows(file, prompts)
    return TraceRows(
        arrival_s=_from_earliest(np.asarray(times, dtype=np.float64)),
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
    )


def _from_earliest(times: np.ndarray) -> np.ndarray:
    """Times from the earliest row's (the first's, in a sorted trace: unchanged then): a row stamped before
    the first is replayed in its place (the replay sorts), not dropped as before the trace's start."""
    earliest = float(times.min())
    return times - earliest if earliest != 0.0 else times


def _read_vidur(file: Path, max_rows: int | None) -> TraceRows:
    columns = ("num_prefill_tokens", "num_decode_tokens")
    prompts: list[int] = []
    outputs: list[int] = []
    for line, (prefill, decode) in _csv_rows(file, columns, max_rows):
        prompts.append(_parse_tokens(prefill, file=file, line=line, column=columns[0]))
        outputs.append(_parse_tokens(decode, file=file, line=line, column=columns[1]))
    _require_rows(file, prompts)
    return TraceRows(
        arrival_s=None,
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
    )


# --- Mooncake JSONL ----------------------------------------------------------------------------------


def _json_field(row: dict[str, object], key: str, *, file: Path, line: int) -> object:
    if key not in row:
        raise ConfigError(f"line {line}: missing key {key!r}", file=file, field=key)
    return row[key]


def _json_tokens(row: dict[str, object], key: str, *, file: Path, line: int) -> int:
    value = _json_field(row, key, file=file, line=line)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"line {line}: expected a number, got {quoted(value)}", file=file, field=key)
    return _parse_tokens(str(value), file=file, line=line, column=key)


def _json_hash_ids(row: dict[str, object], *, file: Path, line: int, input_length: int) -> list[int]:
    """A row's block ids; absent ids mean no prefix information (the request shares nothing)."""
    value = row.get("hash_ids", [])
    # map(type, ...) runs in C: a per-element Python check costs more than json.loads itself.
    if not isinstance(value, list) or (value and (set(map(type, value)) != {int} or min(value) < 0
                                                  or max(value) >= 1 << 63)):
        raise ConfigError(f"line {line}: expected a list of non-negative integers below 2**63", file=file,
                          field="hash_ids")
    if value and len(value) < input_length // MOONCAKE_BLOCK_TOKENS:
        # Every full 512-token block needs an id; the format has ceil(input_length / 512) of them.
        raise ConfigError(
            f"line {line}: {len(value)} ids cannot cover {input_length} tokens in {MOONCAKE_BLOCK_TOKENS}-token blocks",
            file=file,
            field="hash_ids",
        )
    return value


def _read_mooncake(file: Path, max_rows: int | None) -> TraceRows:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    ids: list[int] = []
    offsets = [0]
    with file.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            if max_rows is not None and len(prompts) >= max_rows:
                break
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise ConfigError(f"line {line}, column {error.colno}: invalid JSON: {error.msg}", file=file) from None
            except RecursionError:
                raise ConfigError(f"line {line}: JSON nested too deeply", file=file) from None
            if not isinstance(row, dict):
                raise ConfigError(f"line {line}: expected a JSON object", file=file)
            stamp_ms = _json_field(row, "timestamp", file=file, line=line)
            if isinstance(stamp_ms, bool) or not isinstance(stamp_ms, int | float) or not math.isfinite(stamp_ms):
                raise ConfigError(
                    f"line {line}: expected a number of milliseconds, got {quoted(stamp_ms)}",
                    file=file,
                    field="timestamp",
                )
            prompt = _json_tokens(row, "input_length", file=file, line=line)
            times.append(float(stamp_ms) / 1000.0)
            prompts.append(prompt)
            outputs.append(_json_tokens(row, "output_length", file=file, line=line))
            ids.extend(_json_hash_ids(row, file=file, line=line, input_length=prompt))
            offsets.append(len(ids))
    _require_rows(file, prompts)
    return TraceRows(
        arrival_s=_from_earliest(np.asarray(times, dtype=np.float64)),
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        hash_id_values=np.asarray(ids, dtype=np.int64),
        hash_id_offsets=np.asarray(offsets, dtype=np.int64),
    )


def _require_rows(file: Path, prompts: list[int]) -> None:
    if not prompts:
        raise ConfigError("trace has no data rows", file=file)

"""Length distributions (registered by name for ``dist:``) of prompts, answers and session turns:
fixed, uniform, log-normal, and empirical (resampled from a trace's column)."""

import functools
from pathlib import Path
from typing import Annotated, Literal, Self

import numpy as np
from pydantic import Field, model_validator

from simulator.workload.random_streams import Stream, rng
from simulator.workload.section import Section
from simulator.workload.traces import MAX_TOKENS, TraceFormat, TraceRows, load_trace, resolve_trace_path


class FixedLength(Section):
    """Every sample has the same value."""

    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_TOKENS)
    """The value (tokens, or turns for a session length)."""

    def sample(self, rng: np.random.Generator, size: int, base_dir: Path | None) -> np.ndarray:
        return np.full(size, self.value, dtype=np.int64)


class UniformLength(Section):
    """Integers drawn uniformly from [low, high], both ends included."""

    dist: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_TOKENS)
    """Smallest value (tokens or turns)."""
    high: int = Field(ge=1, le=MAX_TOKENS)
    """Largest value (tokens or turns), >= low."""

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator, size: int, base_dir: Path | None) -> np.ndarray:
        return rng.integers(self.low, self.high, size, endpoint=True, dtype=np.int64)


class LognormalLength(Section):
    """Log-normal lengths, rounded and clamped: the usual fit to chat prompt and answer lengths."""

    dist: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, le=MAX_TOKENS)
    """Median value (tokens or turns): exp(mu) of the underlying normal."""
    sigma: float = Field(ge=0, le=20)
    """Standard deviation of log(value); larger means a longer tail, 0 makes every value the median (at most
    20: past it nearly every value is clamped to min or max, and exp overflows)."""
    min: int = Field(default=1, ge=1)
    """Smallest value after rounding; 1 because a request needs at least one token."""
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Largest value; None leaves the tail unbounded (set it to the model's context length)."""

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, size: int, base_dir: Path | None) -> np.ndarray:
        values = np.rint(np.exp(rng.normal(np.log(self.median), self.sigma, size)))
        # Clipped in float (no int64 overflow); an unbounded tail still stops at what a request can hold.
        upper = float(self.max) if self.max is not None else float(MAX_TOKENS)
        return np.clip(values, self.min, upper).astype(np.int64)


class EmpiricalLength(Section):
    """Values resampled with replacement from one column of a trace file.

    When prompt_tokens and output_tokens both name the same file, they draw the same rows, so the
    correlation between prompt and answer lengths in the trace is kept.
    """

    dist: Literal["empirical"] = "empirical"
    format: TraceFormat
    """Trace file format (azure, mooncake, vidur)."""
    path: str
    """Trace file; relative to the scenario file's folder, or ``${traces}/<file>`` for the shipped traces."""
    column: Literal["prompt_tokens", "output_tokens"]
    """Which length of the trace's rows to resample; zeros in the trace count as 1."""

    def sample(self, rng: np.random.Generator, size: int, base_dir: Path | None) -> np.ndarray:
        values = self.values(base_dir)
        return values[rng.integers(0, len(values), size)]

    def values(self, base_dir: Path | None) -> np.ndarray:
        path = resolve_trace_path(self.path, base_dir)
        rows = _cached_trace(self.format, path, path.stat().st_mtime_ns if path.is_file() else -1)
        return np.maximum(getattr(rows, self.column), 1)


LengthConfig = Annotated[FixedLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="dist")]


LENGTH_DISTRIBUTIONS: dict[str, type[Section]] = {
    "fixed": FixedLength,
    "uniform": UniformLength,
    "lognormal": LognormalLength,
    "empirical": EmpiricalLength,
}


def sample_lengths(
    prompt: LengthConfig, output: LengthConfig, seed: int, size: int, base_dir: Path | None
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths; two empirical columns of one file draw the same rows (keeps correlation)."""
    prompt_rng, output_rng = rng(seed, Stream.PROMPT), rng(seed, Stream.OUTPUT)
    if (
        isinstance(prompt, EmpiricalLength)
        and isinstance(output, EmpiricalLength)
        and (prompt.format, prompt.path) == (output.format, output.path)
    ):
        rows = prompt_rng.integers(0, len(prompt.values(base_dir)), size)
        return prompt.values(base_dir)[rows], output.values(base_dir)[rows]
    return prompt.sample(prompt_rng, size, base_dir), output.sample(output_rng, size, base_dir)


@functools.lru_cache(maxsize=8)
def _cached_trace(trace_format: TraceFormat, path: Path, mtime_ns: int) -> TraceRows:
    """Empirical distributions reread the same file for prompt and output: read it once per version."""
    return load_trace(trace_format, path)

"""Grids: the step compositions the profiler times, as named, seeded sets of points.

A ``GridPoint`` is one step: decode rows with given contexts and prompt chunks over given cached
prefixes, whose StepShape comes from the serving core's own ``compute_shape`` (one formula for the
profiler, the fit and the simulator). A ``Grid`` is a named set of points with the repeat policy they are
measured under; ``GRIDS`` holds the presets ``--grid`` picks by name. Plain data: this module never
runs a model and never times anything (calibration/profiler.py does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from calibration.timing import RepeatPolicy
from simulator.core.request import Request, RequestSpec
from simulator.core.step import StepPlan, StepShape, compute_shape
from simulator.errors import ConfigError


class PointKind(StrEnum):
    DECODE = "decode"
    """Decode rows only: batch × context."""
    PREFILL = "prefill"
    """Prompt chunks only: chunk × cached prefix (one or more chunks)."""
    MIXED = "mixed"
    """Decode rows plus prompt chunks in one step (checks additivity)."""


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One step composition: decode rows by context, prompt chunks by (new tokens, cached prefix)."""

    name: str
    """Stable identifier: what a resumed run matches on."""
    decode_contexts: tuple[int, ...] = ()
    """Context (keys attended, own new token included) of each decode row; each is >= 1."""
    chunks: tuple[tuple[int, int], ...] = ()
    """(new tokens, cached prefix tokens) of each prompt chunk; new tokens >= 2."""

    def __post_init__(self) -> None:
        if not self.decode_contexts and not self.chunks:
            raise ValueError(f"grid point {self.name!r} has no rows")
        if any(c < 1 for c in self.decode_contexts) or any(n < 2 or p < 0 for n, p in self.chunks):
            raise ValueError(f"grid point {self.name!r}: decode contexts >= 1, chunks of >= 2 new tokens")

    @property
    def kind(self) -> PointKind:
        if self.decode_contexts and self.chunks:
            return PointKind.MIXED
        return PointKind.DECODE if self.decode_contexts else PointKind.PREFILL

    def rows(self) -> list[tuple[int, int]]:
        """(num_new_tokens, num_computed_tokens) per scheduled sequence, decodes first (as the core orders
        running requests before admissions)."""
        return [(1, c - 1) for c in self.decode_contexts] + [(n, p) for n, p in self.chunks]

    @property
    def shape(self) -> StepShape:
        return shape_of(self.rows())

    @property
    def max_context(self) -> int:
        return max(n + p for n, p in self.rows())

    @property
    def max_chunk(self) -> int:
        return max((n for n, _ in self.chunks), default=0)

    def num_blocks(self, block_size: int) -> int:
        """Physical blocks the point needs (every row gets its own)."""
        return sum(-(-(n + p) // block_size) for n, p in self.rows())


def shape_of(rows: Sequence[tuple[int, int]]) -> StepShape:
    """The StepShape of (new, computed) rows, through the core's own ``compute_shape`` (one formula)."""
    plan = StepPlan(0)
    for i, (num_new, num_computed) in enumerate(rows):
        request = Request(RequestSpec(request_id=i, arrival_s=0.0, prompt_tokens=num_new + num_computed,
                                      output_tokens=1))
        request.num_computed_tokens = num_computed
        plan.add(request, num_new)
    return compute_shape(plan)


# ----- grids -------------------------------------------------------------------------------------------


def decode_point(batch: int, context: int) -> GridPoint:
    return GridPoint(f"decode_b{batch}_c{context}", decode_contexts=(context,) * batch)


def prefill_point(chunk: int, prefix: int, num_chunks: int = 1) -> GridPoint:
    suffix = f"_x{num_chunks}" if num_chunks > 1 else ""
    return GridPoint(f"prefill_n{chunk}_p{prefix}{suffix}", chunks=((chunk, prefix),) * num_chunks)


def mixed_point(batch: int, context: int, chunk: int, prefix: int = 0) -> GridPoint:
    return GridPoint(
        f"mixed_b{batch}_c{context}_n{chunk}_p{prefix}", decode_contexts=(context,) * batch, chunks=((chunk, prefix),)
    )


def skewed_point(batch: int, mean_context: int) -> GridPoint:
    """Same Σctx as ``decode_point(batch, mean_context)`` but one long row and many short ones: tests that
    decode attention scales with Σctx, not with max context (research §7.3)."""
    short = max(1, mean_context // 4)
    long = batch * mean_context - (batch - 1) * short
    return GridPoint(f"decode_b{batch}_skew{mean_context}", decode_contexts=(long,) + (short,) * (batch - 1))


def ramp_point(batch: int, low: int, high: int) -> GridPoint:
    """Decode contexts spread evenly over [low, high]: a heterogeneous batch as a real engine runs it."""
    contexts = tuple(round(float(c)) for c in np.linspace(low, high, batch))
    return GridPoint(f"decode_b{batch}_ramp{low}-{high}", decode_contexts=contexts)


@dataclass(frozen=True, slots=True)
class Grid:
    """A named set of points with the repeat policy they are measured under."""

    name: str
    model: str
    """Model the grid is sized for (calibration/engine/configs.py)."""
    points: tuple[GridPoint, ...]
    policy: RepeatPolicy
    num_passes: int = 1
    """Times the whole grid runs (each pass in a fresh random order); > 1 exposes drift."""
    description: str = ""

    def __post_init__(self) -> None:
        names = [p.name for p in self.points]
        if len(set(names)) != len(names):
            raise ValueError(f"grid {self.name!r} repeats point names")

    def max_blocks(self, block_size: int) -> int:
        return max(p.num_blocks(block_size) for p in self.points)


def _product(batches: Iterable[int], contexts: Iterable[int], *, max_tokens: int | None = None) -> list[GridPoint]:
    """decode_point(b, c) for every pair, leaving out those holding more than ``max_tokens`` of context."""
    ctx = list(contexts)
    return [decode_point(b, c) for b in batches for c in ctx if max_tokens is None or b * c <= max_tokens]


def ci_grid() -> Grid:
    """Seconds on the tiny model: every regime present, few repeats."""
    points = [
        *_product((1, 4, 16, 32), (16, 128, 384)),
        skewed_point(16, 128),
        *[prefill_point(n, p) for n in (16, 64, 128, 256) for p in (0, 128)],
        prefill_point(32, 0, num_chunks=4),
        mixed_point(8, 64, 64),
        mixed_point(16, 128, 128, 64),
        mixed_point(4, 256, 32),
    ]
    return Grid("ci", "tiny", tuple(points), RepeatPolicy(num_warmup=2, num_repeats=5, min_repeats=3, budget_s=0.2),
                description="CI smoke grid on the tiny model")


CPU_MAX_CONTEXT_TOKENS = 16384
"""Largest Σctx of a CPU grid point. Beyond ~16K context tokens per step the small model's per-layer KV
gather (32 MB and up, freshly allocated each layer) stops scaling linearly on a 2-core VM (measured: 16K →
32K tokens took 4-5x, not 2x); the validation workloads stay below it, so the grid does too."""


def cpu_grid() -> Grid:
    """A few minutes on the ``small`` model with 1 CPU thread; covers the validation workload's steps
    (decode batches up to 64, contexts to 2K, chunks to 512 over cached prefixes). Dense where the
    validation workload runs: at its moderate load most steps decode 1–4 sequences at 80–400 tokens of
    context each (measured: 53 % batch 1, 22 % batch 2, 15 % batch 3–4), and on CPU the step from one
    token (matrix-vector matmuls) to two (matrix-matrix) is the largest jump in the grid."""
    points = [
        *_product((1, 2, 3, 4, 6), (32, 128, 256, 512, 1024, 2048)),
        *_product((8, 16, 32, 64), (32, 256, 1024, 2048), max_tokens=CPU_MAX_CONTEXT_TOKENS),
        skewed_point(16, 512),
        skewed_point(64, 256),
        ramp_point(32, 16, 960),
        ramp_point(48, 64, 512),
        *[prefill_point(n, p) for n in (8, 32, 64, 128, 256, 512) for p in (0, 256, 1536)],
        *[prefill_point(n, 0) for n in (2, 16, 48, 96, 192, 384)],
        prefill_point(1024, 0),
        prefill_point(64, 0, num_chunks=4),
        prefill_point(128, 128, num_chunks=3),
        *[mixed_point(b, c, n) for b in (4, 16, 48) for c, n in ((128, 64), (512, 256))],
        mixed_point(8, 256, 128, 512),
        mixed_point(16, 512, 32, 128),
        # small decode batches next to a chunk, as the validation workload's mixed steps are
        *[mixed_point(b, c, n) for b, c, n in ((1, 256, 128), (2, 256, 256), (3, 384, 509), (1, 128, 32))],
        mixed_point(2, 256, 128, 256),
    ]
    # Six passes in fresh random orders, spread over ~4 minutes: `fleetsim calibrate` fits their mean (the
    # engine later runs at the host's average speed; ``aggregate_passes``). Repeats inside a pass are taken
    # back to back, at one moment of the host's drift, so the independent samples are the passes: the two
    # passes of a 512-token prefill differed by up to 25 % on this VM (fidelity runs of 2026-11-29), and the
    # tail of TTFT follows that estimate. Fewer repeats per pass pay for the extra passes.
    return Grid("cpu", "small", tuple(points),
                RepeatPolicy(num_warmup=2, num_repeats=5, min_repeats=3, budget_s=0.3), num_passes=6,
                description="CPU calibration grid on the small model")


def gpu_grid() -> Grid:
    """Research §7.3 for Llama-3-8B TP 1 on an H200 (points beyond the KV pool are skipped at run time)."""
    decode = [
        decode_point(b, c)
        for b in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
        for c in (256, 1024, 4096, 16384)
    ]
    skews = [skewed_point(32, 1024), skewed_point(128, 1024), ramp_point(64, 128, 4096)]
    prefill = [prefill_point(n, p) for n in (16, 64, 256, 512, 1024, 2048, 4096, 8192) for p in (0, 2048, 16384)]
    multi = [prefill_point(2048 // k, 0, num_chunks=k) for k in (4, 16)]
    mixed = [mixed_point(b, 1024, n) for b in (32, 128) for n in (256, 2048)]
    return Grid("gpu", "llama-3-8b", tuple(decode + skews + prefill + multi + mixed),
                RepeatPolicy(num_warmup=5, num_repeats=15, min_repeats=5, budget_s=1.0),
                description="research §7.3 grid, Llama-3-8B TP 1")


def layer_grid(model: str, *, quick: bool = False) -> Grid:
    """Per-layer grid for big models at TP shapes (research §7.3): decode B × ctx, prefill n."""
    batches = (1, 8, 32) if quick else (1, 8, 32, 128, 256)
    contexts = (64,) if quick else (1024, 8192)
    chunks = (32,) if quick else (256, 2048, 8192)
    points = [*_product(batches, contexts), *[prefill_point(n, 0) for n in chunks]]
    policy = RepeatPolicy(num_warmup=1, num_repeats=3, min_repeats=2, budget_s=0.05) if quick else RepeatPolicy(
        num_warmup=5, num_repeats=10, min_repeats=5, budget_s=0.5
    )
    return Grid(f"layers-{model}", model, tuple(points), policy, description=f"per-layer grid for {model}")


GRIDS = {"ci": ci_grid, "cpu": cpu_grid, "gpu": gpu_grid}
"""Grid presets by name (``--grid``)."""


def get_grid(name: str) -> Grid:
    try:
        return GRIDS[name]()
    except KeyError:
        raise ConfigError(f"unknown grid {name!r}; known: {', '.join(GRIDS)}", field="grid") from None

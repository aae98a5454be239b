"""Per-replica time series on a fixed sampling grid (``ReplicaSeries``, fed after every step on the
simulator's hot path) and the fleet-wide means taken over them.

On the per-step path, so ``fleetsim build-native`` compiles it; it must never import simpy or the
simulator's replica/fleet modules (they import it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.results.table import Table

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------------------------------------
# Per-replica time series (hot path)
# --------------------------------------------------------------------------------------------------------


SERIES_COLUMNS: tuple[str, ...] = (
    "time_s",
    "running",
    "waiting",
    "kv_used_blocks",
    "kv_total_blocks",
    "prefix_hit_tokens_cum",
    "prompt_tokens_cum",
)


class ReplicaSeries:
    """State of one replica sampled on a fixed grid ``start_s + k * sample_interval_s``.

    The replica calls ``maybe_sample`` after every step with its state *after* that step. State only
    changes at steps, so between two calls it is the state reported at the earlier call: a grid point
    that falls strictly between two calls records the earlier state, one that falls exactly on a call
    records that call's state. Grid points are therefore identical across replicas (the fleet view sums
    them), a long idle gap is filled with the idle state, and the cost is one comparison per step plus
    one tuple store, with memory O(duration / interval). Call ``close(end_s)`` once at the end to fill
    the grid up to the end of the run.

    Cache hit rate is reported two ways from the cumulative counters: ``prefix_hit_rate`` is *windowed*
    (hit tokens / prompt tokens admitted since the previous grid point; NaN when no prompt was admitted),
    which shows the cache warming up and thrashing; ``prefix_hit_rate_cum`` is cumulative since the start.

    Two figures for the Summary ride along: ``peak_running``, the most requests running after any step
    (one comparison per call), and, when a ``kv_probe`` is set, the KV slots allocated and the slots
    allocated but holding no token, summed over the first call at or after each grid point (the probe
    walks the running requests, so it runs once per grid point, never per step). ``close`` drops the
    probe so a finished series keeps no reference to the replica.
    """

    def __init__(self, replica: int, sample_interval_s: float, start_s: float = 0.0) -> None:
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        self.replica = replica
        self.sample_interval_s = float(sample_interval_s)
        self.start_s = float(start_s)
        self._next_index = 0
        self.next_sample_s = self.start_s
        """The next grid point: a call before it only replaces the state the grid will be filled with
        (an attribute, not a property: decode runs read it on every sample check)."""
        # A replica starts empty; kv_total 0 makes kv_util read 0 until the first real report.
        self._last: tuple[float, int, int, int, int, int, int] = (self.start_s, 0, 0, 0, 0, 0, 0)
        self._rows: list[tuple[float, int, int, int, int, int, int]] = []
        self.peak_running = 0
        """Most requests running after any one step."""
        self.kv_probe: Callable[[], tuple[int, int]] | None = None
        """Returns (KV slots allocated, of which reserved but holding no token) of the replica now."""
        self.kv_allocated_slots_sum = 0
        self.kv_unused_slots_sum = 0

    def maybe_sample(
        self,
        t: float,
        running: int,
        waiting: int,
        kv_used_blocks: int,
        kv_total_blocks: int,
        prefix_hit_tokens_cum: int,
        prompt_tokens_cum: int,
    ) -> None:
        row = (t, running, waiting, kv_used_blocks, kv_total_blocks, prefix_hit_tokens_cum, prompt_tokens_cum)
        if running > self.peak_running:
            self.peak_running = running
        if t >= self.next_sample_s:
            if self.kv_probe is not None:
                allocated, unused = self.kv_probe()
                self.kv_allocated_slots_sum += allocated
                self.kv_unused_slots_sum += unused
            self._fill_before(t)  # grid points before t saw the previous state
            self._last = row
            if t == self.next_sample_s:
                self._fill_one()
            return
        self._last = row

    def close(self, end_s: float) -> None:
        """Fill every grid point up to and including ``end_s`` with the last reported state."""
        self.kv_probe = None
        self._fill_before(end_s)
        if end_s == self.next_sample_s:
            self._fill_one()

    def _advance(self) -> None:
        self._next_index += 1
        # Multiply rather than accumulate: every replica computes bit-identical grid times.
        self.next_sample_s = self.start_s + self._next_index * self.sample_interval_s

    def _fill_one(self) -> None:
        self._rows.append((self.next_sample_s, *self._last[1:]))
        self._advance()

    def _fill_before(self, t: float) -> None:
        while self.next_sample_s < t:
            self._fill_one()

    def __len__(self) -> int:
        return len(self._rows)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its fields (the compiled build's native class has no instance dict); an open series'
        ``kv_probe`` pickles only if the callable does."""
        state = (self.replica, self.sample_interval_s, self.start_s, self._next_index, self.next_sample_s,
                 self._last, list(self._rows), self.peak_running, self.kv_probe, self.kv_allocated_slots_sum,
                 self.kv_unused_slots_sum)
        return (_restore_series, state)

    def columns(self) -> dict[str, np.ndarray]:
        """Raw sampled columns (see ``SERIES_COLUMNS``)."""
        if not self._rows:
            return {name: np.zeros(0, dtype=np.float64 if name == "time_s" else np.int64) for name in SERIES_COLUMNS}
        table = np.array(self._rows, dtype=np.float64)
        out = {"time_s": table[:, 0]}
        for i, name in enumerate(SERIES_COLUMNS[1:], start=1):
            out[name] = table[:, i].astype(np.int64)
        return out

    def table(self) -> dict[str, np.ndarray]:
        """The series as saved and plotted, as named columns: ``replica``, the sampled columns, and the
        derived ``kv_util`` and windowed / cumulative prefix hit rates (see the class)."""
        c = self.columns()
        with np.errstate(divide="ignore", invalid="ignore"):
            kv_util = np.where(c["kv_total_blocks"] > 0, c["kv_used_blocks"] / c["kv_total_blocks"], 0.0)
            hit, prompt = c["prefix_hit_tokens_cum"], c["prompt_tokens_cum"]
            d_hit = np.diff(hit, prepend=0)
            d_prompt = np.diff(prompt, prepend=0)
            windowed = np.where(d_prompt > 0, d_hit / d_prompt, np.nan)
            cumulative = np.where(prompt > 0, hit / prompt, np.nan)
        return {
            "replica": np.full(len(c["time_s"]), self.replica, dtype=np.int32),
            **c,
            "kv_util": kv_util,
            "prefix_hit_rate": windowed,
            "prefix_hit_rate_cum": cumulative,
        }

    def to_frame(self) -> pd.DataFrame:
        """``table`` as a DataFrame."""
        return Table(self.table()).to_pandas()


def _restore_series(replica: int, sample_interval_s: float, start_s: float, next_index: int, next_sample_s: float,
                    last: tuple[float, int, int, int, int, int, int],
                    rows: list[tuple[float, int, int, int, int, int, int]], peak_running: int,
                    kv_probe: Callable[[], tuple[int, int]] | None, kv_allocated_slots_sum: int,
                    kv_unused_slots_sum: int) -> ReplicaSeries:
    series = ReplicaSeries(replica, sample_interval_s, start_s)
    series._next_index = next_index
    series.next_sample_s = next_sample_s
    series._last = last
    series._rows = rows
    series.peak_running = peak_running
    series.kv_probe = kv_probe
    series.kv_allocated_slots_sum = kv_allocated_slots_sum
    series.kv_unused_slots_sum = kv_unused_slots_sum
    return series


def fleet_kv_util_mean(series: Sequence[ReplicaSeries], *, warmup_s: float = 0.0) -> float:
    """Mean KV utilisation over replicas and grid points at or after ``warmup_s`` (a time average,
    because the grid is regular). NaN when there is no sample."""
    values: list[np.ndarray] = []
    for s in series:
        c = s.columns()
        keep = (c["time_s"] >= warmup_s) & (c["kv_total_blocks"] > 0)
        values.append(c["kv_used_blocks"][keep] / c["kv_total_blocks"][keep])
    allv = np.concatenate(values) if values else np.zeros(0)
    return float(allv.mean()) if allv.size else math.nan


def fleet_running_mean(series: Sequence[ReplicaSeries], *, warmup_s: float = 0.0) -> float:
    """Mean number of running requests per replica over grid points at or after ``warmup_s`` (a time
    average, because the grid is regular). NaN when there is no sample."""
    values = []
    for s in series:
        c = s.columns()
        values.append(c["running"][c["time_s"] >= warmup_s])
    allv = np.concatenate(values) if values else np.zeros(0)
    return float(allv.mean()) if allv.size else math.nan


def fleet_kv_waste(series: Sequence[ReplicaSeries]) -> float:
    """Share of allocated KV slots that held no token (reserved ahead, or the unfilled tail of a block),
    over the probed grid points of every replica. NaN when nothing was ever allocated at a probe."""
    allocated = sum(s.kv_allocated_slots_sum for s in series)
    unused = sum(s.kv_unused_slots_sum for s in series)
    return unused / allocated if allocated else math.nan

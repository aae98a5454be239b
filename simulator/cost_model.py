"""CostModel: the time of one engine step, from a Profile and the step's shape.

This is on the simulator's hot path (one call per simulated step per replica), so ``step_time`` is plain
float arithmetic over constants precomputed in ``__init__``: no numpy, no allocation, no attribute chains.
``decode_times`` is the vectorised twin for the multi-step fast path; it performs the same float
operations in the same order, so both paths give bit-identical times (a test holds them to that).

Never imports ``calibration``.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.core.step import StepShape
from simulator.profile import CommModel, Profile

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


def allreduce_time_s(num_bytes: float, tp: int, alpha_s: float, bus_bandwidth_Bps: float) -> float:
    """One ring all-reduce of ``num_bytes`` over ``tp`` ranks: α + 2(p−1)/p · bytes / BW."""
    if tp <= 1:
        return 0.0
    return alpha_s + 2.0 * (tp - 1) / tp * num_bytes / bus_bandwidth_Bps


class CostModel:
    """Step time (device + host, or their max when the engine overlaps them) of one replica."""

    __slots__ = (
        "_a0",
        "_buckets",
        "_comm_fixed",
        "_comm_per_token",
        "_decode_consts",
        "_f",
        "_factor",
        "_h0",
        "_hn",
        "_hs",
        "_inv_p",
        "_k",
        "_m",
        "_overlap",
        "_p",
        "_q",
        "_s",
        "_swap_per_token",
        "_w_pow",
        "profile",
    )

    def __init__(self, profile: Profile, *, factor: float = 1.0) -> None:
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        self.profile = profile
        dev = profile.device_s
        self._a0 = dev.a0_s
        self._f = dev.per_token_s
        self._p = dev.knee_p
        self._inv_p = 1.0 / dev.knee_p
        self._w_pow: float = dev.weight_s**dev.knee_p  # typed: a float power is Any to mypy (a generic add compiled)
        self._k = dev.per_ctx_token_s
        self._q = dev.per_attn_pair_s
        self._s = dev.per_seq_s
        self._m = dev.multi_token_s
        host = profile.host_s
        self._h0 = host.h0_s
        self._hs = host.per_seq_s
        self._hn = host.per_token_s
        self._overlap = profile.overlap_host
        self._comm_fixed, self._comm_per_token = _comm_terms(profile.comm, profile.tp)
        # A swapped token moves its per-rank KV slice over that rank's own host link, in parallel.
        self._swap_per_token = profile.memory.kv_bytes_per_token / profile.host_link_Bps
        self._buckets = list(profile.cuda_graph_batch_sizes)
        self._factor = factor
        self._decode_consts: dict[int, tuple[float, float]] = {}
        """(base, host) seconds of a decode-only step of each batch size seen (``decode_step_ends``)."""

    # -- one step -------------------------------------------------------------------------------------

    # _base_s, _host_s and _bucket are the reference spelling of each term; step_time inlines the same
    # expressions, in the same order, because a method call per term doubles its cost on the hot path.

    def _base_s(self, num_seqs: int, num_tokens: int) -> float:
        """Device time that depends only on sequences and tokens: a0 + smoothmax(W, f·N) + m·[N > 1] + s·B
        + comm. (With m = 0, the default, adding it changes no bit of the sum.)"""
        knee = (self._w_pow + (self._f * num_tokens) ** self._p) ** self._inv_p
        multi = self._m if num_tokens > 1 else 0.0
        return (self._a0 + knee + multi + self._s * num_seqs
                + (self._comm_fixed + self._comm_per_token * num_tokens))

    def _host_s(self, num_seqs: int, num_tokens: int) -> float:
        return self._h0 + self._hs * num_seqs + self._hn * num_tokens

    def _bucket(self, num_seqs: int) -> int:
        """The CUDA-graph batch a decode-only step of ``num_seqs`` runs as (itself beyond the last one)."""
        i = bisect.bisect_left(self._buckets, num_seqs)
        return self._buckets[i] if i < len(self._buckets) else num_seqs

    def _padded(self, shape: StepShape) -> tuple[int, int]:
        """(sequences, tokens) as the engine runs them: decode-only steps pad B to a CUDA-graph bucket."""
        if self._buckets and shape.num_prefill_tokens == 0 and shape.num_seqs > 0:
            b = self._bucket(shape.num_seqs)
            if b != shape.num_seqs:
                return b, b
        return shape.num_seqs, shape.num_new_tokens

    def device_time(self, shape: StepShape) -> float:
        """Device seconds of the step (forward, attention, all-reduces, KV swap copies)."""
        if shape.num_seqs == 0:
            return shape.num_swap_tokens * self._swap_per_token * self._factor
        b, n = self._padded(shape)
        t = self._base_s(b, n) + self._k * shape.decode_context_sum + self._q * shape.prefill_attention_pairs
        if shape.num_swap_tokens:
            t += shape.num_swap_tokens * self._swap_per_token
        return t * self._factor

    def host_time(self, shape: StepShape) -> float:
        """Host seconds of the step (scheduling, input preparation, sampling sync); 0 for an empty step."""
        if shape.num_seqs == 0:
            return 0.0
        b, n = self._padded(shape)
        return self._host_s(b, n) * self._factor

    def step_time(self, shape: StepShape) -> float:
        """Seconds the replica's clock advances for this step; an empty step costs 0."""
        return self.time_of(shape.num_seqs, shape.num_new_tokens, shape.num_decode_seqs, shape.decode_context_sum,
                            shape.num_prefill_tokens, shape.prefill_attention_pairs, shape.num_swap_tokens)

    def time_of(self, num_seqs: int, num_new_tokens: int, num_decode_seqs: int, decode_context_sum: int,
                num_prefill_tokens: int, prefill_attention_pairs: float, num_swap_tokens: int) -> float:
        """``step_time`` of the shape with these fields (``step.shape_fields`` of a plan), without building it:
        the simulator prices every step this way."""
        b = num_seqs
        if b == 0:
            return num_swap_tokens * self._swap_per_token * self._factor
        n = num_new_tokens
        if self._buckets and num_prefill_tokens == 0:
            padded = self._bucket(b)
            if padded != b:
                b = n = padded
        # math.pow, not **: the same C pow() for these finite positive operands, and a direct call in the
        # compiled build (** on floats is a generic number protocol call there).
        knee = math.pow(self._w_pow + math.pow(self._f * n, self._p), self._inv_p)
        dev = (
            self._a0 + knee + (self._m if n > 1 else 0.0) + self._s * b + (self._comm_fixed + self._comm_per_token * n)
            + self._k * decode_context_sum
            + self._q * prefill_attention_pairs
        )
        if num_swap_tokens:
            dev += num_swap_tokens * self._swap_per_token
        host = self._h0 + self._hs * b + self._hn * n
        if self._overlap:
            return (dev if dev > host else host) * self._factor
        return (dev + host) * self._factor

    # -- many decode steps ----------------------------------------------------------------------------

    def decode_times(self, batch: int, ctx_sum_start: int, num_steps: int) -> np.ndarray:
        """Times of ``num_steps`` consecutive decode-only steps of ``batch`` sequences, the first with
        context sum ``ctx_sum_start``, each later one ``batch`` tokens more (every sequence grows by one).

        Equal, element by element and to the bit, to ``step_time`` of the same shapes.
        """
        if num_steps <= 0:
            return np.empty(0, dtype=np.float64)
        if batch <= 0:
            return np.zeros(num_steps, dtype=np.float64)
        shape = StepShape(batch, batch, batch, ctx_sum_start, 0, 0.0)
        b, n = self._padded(shape)
        base = self._base_s(b, n)
        ctx = np.arange(num_steps, dtype=np.int64) * batch + ctx_sum_start
        # Same operation order as step_time: (base + k·ctx) + q·0.0, then host, then the factor.
        dev = base + self._k * ctx.astype(np.float64) + self._q * 0.0
        host = self._host_s(b, n)
        total = np.maximum(dev, host) if self._overlap else dev + host
        return total * self._factor

    def decode_step_ends(self, batch: int, ctx_sum_start: int, num_steps: int, start_s: float) -> list[float]:
        """End times of the steps ``decode_times`` describes, run back to back from ``start_s``: each one
        the previous end plus its step time, one addition at a time as a step-by-step clock adds them, so
        equal to the bit. Short runs (most: an arrival or a completion ends them) stay in plain floats,
        where numpy's per-call overhead would dominate; long ones are vectorised."""
        if num_steps > _SHORT_RUN_STEPS:
            times = self.decode_times(batch, ctx_sum_start, num_steps)
            return np.add.accumulate(np.concatenate(([start_s], times)))[1:].tolist()  # type: ignore[no-any-return]
        if num_steps <= 0:
            return []
        if batch <= 0:
            return [start_s] * num_steps
        consts = self._decode_consts.get(batch)
        if consts is None:
            b, n = self._padded(StepShape(batch, batch, batch, ctx_sum_start, 0, 0.0))
            consts = self._decode_consts[batch] = (self._base_s(b, n), self._host_s(b, n))
        base, host = consts
        k = self._k
        attn = self._q * 0.0
        factor = self._factor
        overlap = self._overlap
        ends = [start_s] * num_steps  # filled in place: appending would regrow the list several times
        t = start_s
        ctx = float(ctx_sum_start)  # whole numbers: exact in a double, as float(int) of each step's sum
        step_ctx = float(batch)
        i: i64 = 0  # a while loop over a machine integer: compiled, a range loop boxes its index
        count: i64 = num_steps
        while i < count:
            dev = base + k * ctx + attn
            t += ((dev if dev > host else host) if overlap else dev + host) * factor  # the clock's one addition
            ends[i] = t
            ctx += step_ctx
            i += 1
        return ends

    def decode_total_time(self, batch: int, ctx_sum_start: int, num_steps: int) -> float:
        """Sum of ``decode_times`` in closed form (no array) when host work does not overlap."""
        if self._overlap:
            return float(self.decode_times(batch, ctx_sum_start, num_steps).sum())
        if num_steps <= 0 or batch <= 0:
            return 0.0
        b, n = self._padded(StepShape(batch, batch, batch, ctx_sum_start, 0, 0.0))
        per_step = self._base_s(b, n) + self._host_s(b, n)
        ctx_total = num_steps * ctx_sum_start + batch * num_steps * (num_steps - 1) // 2
        return (num_steps * per_step + self._k * ctx_total) * self._factor

    # -- sensitivity ----------------------------------------------------------------------------------

    @property
    def factor(self) -> float:
        return self._factor

    def scale(self, factor: float) -> CostModel:
        """A cost model whose every time is multiplied by ``factor`` (e.g. 1.1 for a +10 % sensitivity run)."""
        return CostModel(self.profile, factor=self._factor * factor)

    def __repr__(self) -> str:
        scaled = f", factor={self._factor}" if self._factor != 1.0 else ""
        return f"CostModel({self.profile.label}{scaled})"


_SHORT_RUN_STEPS = 256
"""Decode runs up to this many steps are timed in plain Python floats (``decode_step_ends``)."""


def _comm_terms(comm: CommModel | None, tp: int) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of one step's all-reduces: linear in tokens."""
    if comm is None or tp <= 1:
        return 0.0, 0.0
    count = comm.num_allreduce_per_layer * comm.num_layers
    fixed = count * comm.alpha_s
    bytes_per_token = comm.hidden_size * comm.dtype_bytes
    per_token = count * 2.0 * (tp - 1) / tp * bytes_per_token / comm.bus_bandwidth_Bps
    return fixed, per_token

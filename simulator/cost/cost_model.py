"""CostModel: the time of one engine step, from a Profile and the step's shape.

This is on the simulator's hot path (one call per simulated step per replica), so ``step_time`` is plain
float arithmetic over constants precomputed in ``__init__``: no numpy, no allocation, no attribute chains.
For the multi-step fast path, ``StepEnds`` walks a decode run's step end times and ``decode_times`` is
the vectorised list of its step times; both perform the same float operations in the same order, so
every path gives bit-identical times (tests hold them to that).

A mixture-of-experts profile (``profile.moe``) adds one term inside every path's knee: the routed experts'
own roofline, ``smoothmax(expert_weight_s·R(N), expert_per_token_s·N)``, looked up per distinct token count N
(``_expert_s``) so every path reads the same float. Its all-to-all is linear in N and joins the all-reduce
constants. A dense profile never reaches either: its arithmetic is unchanged, bit for bit.

Never imports ``calibration``.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Final

import numpy as np

from simulator.core.step import StepShape
from simulator.cost import moe as routing
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.interpolation import interpolate
from simulator.cost.profile import CommModel, MoeCoefficients, Profile

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
        "_calls",
        "_comm_fixed",
        "_comm_per_token",
        "_comm_x",
        "_comm_y",
        "_curved",
        "_decode_consts",
        "_expert_cache",
        "_experts",
        "_f",
        "_factor",
        "_floor",
        "_graph_max",
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
        "_seq_terms",
        "_seq_x",
        "_seq_y",
        "_swap_per_token",
        "_tok_x",
        "_tok_y",
        "_token_terms",
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
        self._comm_fixed, self._comm_per_token = _comm_terms(profile.comm, profile.tp, profile.moe)
        # Measured curves (fitted-published profiles) replace the analytic term they stand for; their knots
        # are kept as plain lists for ``curve.interpolate``. The all-reduce curve is by message bytes: its
        # knots are moved to tokens (bytes / bytes per token) once, here.
        self._tok_x, self._tok_y = _knots(dev.token_curve)
        self._seq_x, self._seq_y = _knots(dev.seq_curve)
        comm = profile.comm
        self._comm_x: list[float] | None = None
        self._comm_y: list[float] | None = None
        self._calls = 0.0
        if comm is not None and comm.curve is not None and profile.tp > 1:
            per_token = float(comm.bytes_per_token())
            self._comm_x = [x / per_token for x in comm.curve.x]
            self._comm_y = list(comm.curve.y)
            self._calls = float(comm.calls_per_step())
        self._curved = self._tok_x is not None or self._seq_x is not None or self._comm_x is not None
        self._token_terms: dict[int, tuple[float, float]] = {}
        """(token term, all-reduce term) of ``_curve_base`` by token count, as worked out."""
        self._seq_terms: dict[int, float] = {}
        """The sequence term of ``_curve_base`` by sequence count, as worked out."""
        # A swapped token moves its per-rank KV slice over that rank's own host link, in parallel.
        self._swap_per_token = profile.memory.kv_bytes_per_token / profile.host_link_Bps
        self._buckets = list(profile.cuda_graph_batch_sizes)
        self._graph_max = self._buckets[-1] if self._buckets else 0
        """The largest decode batch the engine replays as a CUDA graph (0 without graphs)."""
        self._floor = dev.eager_floor_s
        """The least device time of a step run without a CUDA graph (0: none; only with graphs)."""
        self._factor = factor
        self._decode_consts: dict[int, tuple[float, float]] = {}
        """(base, host) seconds of a decode-only step of each batch size seen (``decode_step_ends``)."""
        self._experts = ExpertReads(profile.moe) if profile.moe is not None else None
        """The routed experts' reads of a mixture-of-experts profile; None for a dense one."""
        self._expert_cache: dict[int, float] = {}
        """Seconds of the routed-expert term by new tokens in the step, for every count seen."""

    # -- one step -------------------------------------------------------------------------------------

    # _base_s, _host_s and _bucket are the reference spelling of each term; step_time inlines the same
    # expressions, in the same order, because a method call per term doubles its cost on the hot path.

    def _base_s(self, num_seqs: int, num_tokens: int) -> float:
        """Device time that depends only on sequences and tokens: a0 + smoothmax(W, f·N) + m·[N > 1] + s·B
        + comm. (With m = 0, the default, adding it changes no bit of the sum.)"""
        if self._curved:
            return self._curve_base(num_seqs, num_tokens)
        knee = (self._w_pow + (self._f * num_tokens) ** self._p) ** self._inv_p
        if self._experts is not None:
            knee += self._expert_s(num_tokens)
        multi = self._m if num_tokens > 1 else 0.0
        return (self._a0 + knee + multi + self._s * num_seqs
                + (self._comm_fixed + self._comm_per_token * num_tokens))

    def _curve_base(self, num_seqs: int, num_tokens: int) -> float:
        """``_base_s`` of a profile with measured curves: each curve in place of the term it measures.
        The token and communication terms are kept per token count and the sequence term per sequence
        count once worked out (a dictionary read is a fraction of the knot search it saves, and a run
        meets few distinct counts: at most ``max_num_batched_tokens`` and ``max_num_seqs``)."""
        terms = self._token_terms.get(num_tokens)
        if terms is None:
            terms = self._token_terms[num_tokens] = self._token_comm_terms(num_tokens)
        seqs = self._seq_terms.get(num_seqs)
        if seqs is None:
            seq_x = self._seq_x
            if seq_x is not None and self._seq_y is not None:
                seqs = interpolate(seq_x, self._seq_y, num_seqs)
            else:
                seqs = self._s * num_seqs
            self._seq_terms[num_seqs] = seqs
        return terms[0] + seqs + terms[1]

    def _token_comm_terms(self, num_tokens: int) -> tuple[float, float]:
        """The token term and the all-reduce term of ``_curve_base`` at ``num_tokens``."""
        tok_x = self._tok_x
        if tok_x is not None and self._tok_y is not None:
            tokens = interpolate(tok_x, self._tok_y, num_tokens)
        else:
            knee = math.pow(self._w_pow + math.pow(self._f * num_tokens, self._p), self._inv_p)
            tokens = self._a0 + knee + (self._m if num_tokens > 1 else 0.0)
        comm_x = self._comm_x
        if comm_x is not None and self._comm_y is not None:
            comm = self._calls * interpolate(comm_x, self._comm_y, num_tokens)
        else:
            comm = self._comm_fixed + self._comm_per_token * num_tokens
        return tokens, comm

    def _expert_s(self, num_tokens: int) -> float:
        """Device seconds of the routed experts in a step of ``num_tokens`` new tokens (MoE profiles only):
        ``smoothmax(expert_weight_s·R(N), expert_per_token_s·N)``, worked out once per N."""
        t = self._expert_cache.get(num_tokens)
        if t is None:
            experts = self._experts
            assert experts is not None  # only called for an MoE profile
            t = self._expert_cache[num_tokens] = experts.time_s(num_tokens, self._p)
        return t

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

    def eager_floor(self, num_seqs: int, num_new_tokens: int) -> float:
        """The floor of a step's device time: ``eager_floor_s`` for a step the engine cannot replay as a CUDA
        graph (a row of more than one new token, or more rows than the largest captured batch), else 0."""
        if not self._buckets:
            return 0.0
        if num_new_tokens != num_seqs or num_seqs > self._graph_max:
            return self._floor
        return 0.0

    def device_time(self, shape: StepShape) -> float:
        """Device seconds of the step (forward, attention, all-reduces, KV swap copies)."""
        if shape.num_seqs == 0:
            return shape.num_swap_tokens * self._swap_per_token * self._factor
        floor = self.eager_floor(shape.num_seqs, shape.num_new_tokens)
        b, n = self._padded(shape)
        t = self._base_s(b, n) + self._k * shape.decode_context_sum + self._q * shape.prefill_attention_pairs
        if t < floor:
            t = floor
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
        floor = 0.0
        if self._buckets:
            if num_prefill_tokens == 0 and n == b and b <= self._graph_max:  # a verification step (n > b) is not padded
                padded = self._bucket(b)
                if padded != b:
                    b = n = padded
            else:
                floor = self._floor  # run without a CUDA graph (eager_floor)
        if self._curved:
            dev = self._curve_base(b, n) + self._k * decode_context_sum + self._q * prefill_attention_pairs
        else:
            # math.pow, not **: the same C pow() for these finite positive operands, and a direct call in the
            # compiled build (** on floats is a generic number protocol call there).
            knee = math.pow(self._w_pow + math.pow(self._f * n, self._p), self._inv_p)
            if self._experts is not None:
                knee += self._expert_s(n)
            dev = (
                self._a0 + knee + (self._m if n > 1 else 0.0) + self._s * b
                + (self._comm_fixed + self._comm_per_token * n)
                + self._k * decode_context_sum
                + self._q * prefill_attention_pairs
            )
        if dev < floor:
            dev = floor
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
        floor = self.eager_floor(batch, batch)
        if floor:
            dev = np.maximum(dev, floor)
        host = self._host_s(b, n)
        total = np.maximum(dev, host) if self._overlap else dev + host
        return total * self._factor

    def decode_step_ends(self, batch: int, ctx_sum_start: int, num_steps: int, start_s: float) -> list[float]:
        """End times of the steps ``decode_times`` describes, run back to back from ``start_s``: each one
        the previous end plus its step time, one addition at a time as a step-by-step clock adds them, so
        equal to the bit (``StepEnds`` lists them; a decode run asks it for the few it needs instead)."""
        ends = StepEnds()
        ends.reset(self, batch, ctx_sum_start, num_steps, start_s)
        return [ends.end(j) for j in range(1, num_steps + 1)]

    def decode_base_host(self, batch: int) -> tuple[float, float]:
        """(device seconds before the context term and the factor, host seconds) of a decode-only step of
        ``batch`` sequences, padded as the engine runs it: the per-batch constants of ``StepEnds``."""
        consts = self._decode_consts.get(batch)
        if consts is None:
            b, n = self._padded(StepShape(batch, batch, batch, 0, 0, 0.0))
            consts = self._decode_consts[batch] = (self._base_s(b, n), self._host_s(b, n))
        return consts

    def decode_total_time(self, batch: int, ctx_sum_start: int, num_steps: int) -> float:
        """Sum of ``decode_times`` in closed form (no array) when host work does not overlap and no step is
        held at the eager floor."""
        if self._overlap or self.eager_floor(batch, batch):
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


class StepEnds:
    """End times of a decode run's steps (``decode_times`` run back to back from a start), worked out on
    demand: each end is the previous one plus its step time, one addition at a time as the step-by-step
    clock adds them, so equal to the bit. Nothing is kept per step: the ends are walked from a cursor that
    moves forward with the questions (one before it restarts the walk from the run's start), so a run cut
    after a few of its planned steps costs those few additions, and no list of floats is built at all.

    Steps are numbered from 1; ``start`` is the run's start (the end of "step 0") and ``last_end()`` the end
    of its last planned step. A run may begin with a step of its own, priced apart (a prefill step the
    decodes follow: ``reset``'s ``first_s``); the decodes then run from its end. A replica reuses one
    object from run to run (``reset``).

    Most runs are cut by an arrival after a few of their planned steps, so the last end is not walked to
    when a run starts: ``reset`` brackets it in closed form (``end_floor`` <= last end <= ``end_ceiling``,
    a few ulps apart; the step times are affine in the step index, clamped at the floors), and the exact
    end is walked to only when it is asked for (``last_end``) or a question's walk reaches it. A replica
    schedules the run's end event at ``end_floor`` and, if it fires there, moves on to the exact end."""

    __slots__ = ("_attn", "_base", "_ctx", "_ctx_start", "_end_known", "_factor", "_first_end", "_floor", "_host",
                 "_j", "_j_start", "_k", "_overlap", "_prev_t", "_step_ctx", "_t", "end_ceiling", "end_floor",
                 "num_steps", "start")

    def __init__(self) -> None:
        self.num_steps: i64 = 0
        self.end_floor = 0.0
        """At or before the last planned step's end (equal to it once known: ``last_end``)."""
        self.end_ceiling = 0.0
        """At or after the last planned step's end (equal to it once known)."""
        self._end_known = True
        self._j: i64 = 0
        """The cursor: ends of steps 1.._j are known, ``_t`` the last of them (the start when _j is 0),
        ``_prev_t`` the one before (the start at _j <= 1), ``_ctx`` the context sum of step _j + 1."""
        self._t = 0.0
        self._prev_t = 0.0
        self._ctx = 0.0
        self.start = 0.0
        self._ctx_start = 0.0
        self._step_ctx = 0.0
        self._base = 0.0
        self._host = 0.0
        self._k = 0.0
        self._attn = 0.0
        self._floor = 0.0
        """The steps' eager floor (``CostModel.eager_floor``): 0 unless the batch is beyond every CUDA graph."""
        self._factor = 1.0
        self._overlap = False
        self._j_start: i64 = 0
        """Where the walk starts over: 0, or 1 when step 1 is a step of its own (ending at ``_first_end``)."""
        self._first_end = 0.0

    def reset(self, model: CostModel, batch: int, ctx_sum_start: int, num_steps: int, start_s: float,
              first_s: float = -1.0) -> None:
        """``num_steps`` decode-only steps of ``batch`` sequences from ``start_s``, the first with context sum
        ``ctx_sum_start``, each later one ``batch`` more (as ``decode_times``). With ``first_s`` >= 0 (and
        ``num_steps`` >= 1), step 1 is a step of its own taking ``first_s`` (ending at ``start_s +
        first_s``, as a step-by-step clock adds it) and the decodes from step 2 on are as above."""
        self.num_steps = num_steps
        self.start = start_s
        if first_s >= 0.0 and num_steps >= 1:
            self._j_start = 1
            self._first_end = start_s + first_s
        else:
            self._j_start = 0
        self._ctx_start = float(ctx_sum_start)  # whole numbers: exact in a double, as float(int) of each sum
        if batch > 0:
            self._base, self._host = model.decode_base_host(batch)
            self._k = model._k
            self._attn = model._q * 0.0
            self._floor = model.eager_floor(batch, batch)
            self._factor = model._factor
            self._overlap = model._overlap
            self._step_ctx = float(batch)
        else:  # an empty batch: steps that take no time (as decode_times' zeros)
            self._base = self._host = self._k = self._attn = self._step_ctx = self._floor = 0.0
            self._factor = 1.0
            self._overlap = False
        self._rewind()
        self._end_known = False
        remaining: i64 = num_steps - self._j
        if remaining <= _WALKED_RUN or not self._bracket_end(remaining):
            self._walk(num_steps, math.inf, False)  # a short run: its end walked to now (sets end_floor)
            self._rewind()  # questions begin at the run's start

    def _bracket_end(self, num_decodes: int) -> bool:
        """Bracket the last step's end in closed form (``end_floor``, ``end_ceiling``) from the cursor at the
        first decode step, ``num_decodes`` decodes before the end; False (nothing set) if the figures are
        not all finite.

        Step i of the decodes (from 0) takes (max(A + B·i, F) + H)·factor, A + B·i being the device time
        before its floor (A = base + k·ctx + attn, B = k·(context added per step)), with F, H the floor and
        host time (overlapping host work: F the larger of the floor and the host time, H zero): a sum of
        affine pieces, added up in closed form. The walk rounds at each of its additions and in each step's
        own arithmetic; the margin bounds both (relative errors of at most 2**-53 an operation, on terms no
        larger than their absolute values), with room to spare."""
        m = float(num_decodes)
        t0 = self._t
        ctx0 = self._ctx
        base = self._base
        k = self._k
        attn = self._attn
        floor = self._floor
        host = self._host
        factor = self._factor
        a = base + k * ctx0 + attn
        b = k * self._step_ctx
        if self._overlap:
            f = floor if floor > host else host
            h = 0.0
        else:
            f = floor
            h = host
        total = (_sum_max_affine(a, b, f, num_decodes) + m * h) * factor
        middle = t0 + total
        # Every term a step's arithmetic meets, at its largest (the last step's context).
        size = (abs(base) + abs(k) * (abs(ctx0) + m * abs(self._step_ctx)) + abs(attn) + abs(floor)
                + abs(host)) * abs(factor)
        reach = abs(t0) + m * size  # bounds every end the walk adds up, and the closed form's terms
        margin = _ROUNDING * (m + 2.0) * (reach + 8.0 * size)
        low = middle - margin
        high = middle + margin
        if not (-math.inf < low and high < math.inf):  # finite (NaN fails both)
            return False
        self.end_floor = low if low > t0 else t0  # steps take no negative time: never before the cursor
        self.end_ceiling = high
        return True

    def last_end(self) -> float:
        """The end of the run's last planned step (the start if it has none), exact: walked to on first
        asking unless a walk got there before; the cursor stays where it was."""
        if self._end_known:
            return self.end_floor
        j = self._j
        t = self._t
        prev = self._prev_t
        ctx = self._ctx
        self._walk(self.num_steps, math.inf, False)  # records the end on reaching it
        self._j = j
        self._t = t
        self._prev_t = prev
        self._ctx = ctx
        return self.end_floor

    def _rewind(self) -> None:
        self._prev_t = self.start
        if self._j_start:
            self._j = 1
            self._t = self._first_end
            self._ctx = self._ctx_start + self._step_ctx  # the decodes' context sums go on from step 2's
        else:
            self._j = 0
            self._t = self.start
            self._ctx = self._ctx_start

    def _walk(self, target: int, bound: float, strict: bool) -> int:
        """Move the cursor on to step ``target`` at most, stopping before the first step that ends after
        ``bound`` (at or after it, if ``strict``); returns the cursor's step."""
        j: i64 = self._j
        last: i64 = target
        t = self._t
        prev = self._prev_t
        ctx = self._ctx
        step_ctx = self._step_ctx
        base = self._base
        k = self._k
        attn = self._attn
        floor = self._floor
        host = self._host
        factor = self._factor
        overlap = self._overlap
        while j < last:
            # A step's time: the same float operations, in the same order, as CostModel.time_of performs for
            # a decode-only shape (and decode_times for a run), spelled out over locals (this runs per step).
            dev = base + k * ctx + attn
            if dev < floor:
                dev = floor
            following = t + ((dev if dev > host else host) if overlap else dev + host) * factor
            if following > bound or (strict and following == bound):
                break
            prev = t
            t = following
            ctx += step_ctx
            j += 1
        self._j = j
        self._t = t
        self._prev_t = prev
        self._ctx = ctx
        if j == self.num_steps and not self._end_known:
            self._end_known = True  # the last end, exact: the bracket closes on it
            self.end_floor = t
            self.end_ceiling = t
        return j

    def end(self, step: int) -> float:
        """The end time of step ``step`` (0 .. num_steps; 0 is the start)."""
        target: i64 = step
        if target == self.num_steps and target > 0 and self._end_known:
            return self.end_floor  # known (walked to once): no second walk for the run's last step
        if target == 0:
            return self.start
        if target <= self._j:
            if target == self._j:
                return self._t
            if target == self._j - 1:
                return self._prev_t
            self._rewind()
        self._walk(target, math.inf, False)
        return self._t

    def ended_by(self, now: float) -> int:
        """How many steps end at or before ``now`` (``bisect.bisect_right`` on the list of ends)."""
        if self.end_ceiling <= now and self.num_steps > 0:
            return self.num_steps  # every step has ended (the common question at a run's natural end)
        if not self._t <= now:
            if self._j == 0:
                return 0
            if self._prev_t <= now:
                return self._j - 1
            self._rewind()
            if not self._t <= now:
                return 0  # before the end of the walk's first step (a step of its own)
        return self._walk(self.num_steps, now, False)

    def ended_before(self, t: float) -> int:
        """How many steps end strictly before ``t`` (``bisect.bisect_left`` on the list of ends)."""
        if self.end_ceiling < t and self.num_steps > 0:
            return self.num_steps
        if not self._t < t:
            if self._j == 0:
                return 0
            if self._prev_t < t:
                return self._j - 1
            self._rewind()
            if not self._t < t:
                return 0
        return self._walk(self.num_steps, t, True)


def _sum_max_affine(a: float, b: float, floor: float, count: int) -> float:
    """Sum of max(a + b·i, floor) for i in 0 .. count - 1, in closed form: the terms above the floor are a
    run at one end (b > 0: the last ones; b < 0: the first ones), found by division and checked term by term
    at its edge (a step or two, against the division's rounding)."""
    if count <= 0:
        return 0.0
    last = a + b * float(count - 1)
    if a >= floor and last >= floor:  # the ends above it, so every term between (the usual case)
        return float(count) * a + b * (float(count * (count - 1)) / 2)
    if a < floor and last < floor:
        return float(count) * floor
    # above: the first i whose term is >= floor (b > 0), or the first below it (b < 0)
    estimate = (floor - a) / b
    limit = float(count)
    above: i64
    if not estimate > 0.0:
        above = 0
    elif not estimate < limit:
        above = count
    else:
        above = math.ceil(estimate) if b > 0.0 else math.floor(estimate) + 1
    if b > 0.0:
        while above > 0 and a + b * float(above - 1) >= floor:
            above -= 1
        while above < count and a + b * float(above) < floor:
            above += 1
        rest = count - above  # terms above[..count): affine
        return float(above) * floor + float(rest) * a + b * (float((above + count - 1) * rest) / 2)
    while above > 0 and a + b * float(above - 1) < floor:
        above -= 1
    while above < count and a + b * float(above) >= floor:
        above += 1
    return float(above) * a + b * (float(above * (above - 1)) / 2) + float(count - above) * floor


_ROUNDING: Final = 4.0 * 2.0**-53
"""A step's arithmetic, and an addition to the running end, each round by at most a few ulps of the terms
involved; four times the unit roundoff, times the terms' size and the number of steps, bounds the walk's
drift from the exact sum with room to spare (the closed form's own rounding included)."""

_WALKED_RUN: Final = 16
"""Runs of at most this many decode steps have their end walked to at once: a bracket, and the end event's
skip to the exact end when the run is not cut, cost about as much as walking a dozen steps (callgrind,
sessions+affinity 20 k compiled: 3, 8, 16 steps gave 2.4957, 2.4917, 2.4896 G instructions; pure 5 k: 16
beat 3 on both chat and sessions)."""


def _knots(curve: PiecewiseLinear | None) -> tuple[list[float] | None, list[float] | None]:
    if curve is None:
        return None, None
    return list(curve.x), list(curve.y)


def _comm_terms(comm: CommModel | None, tp: int, moe: MoeCoefficients | None = None) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of one step's all-reduces, and with expert parallelism its
    all-to-alls: linear in tokens."""
    if moe is not None and moe.ep > 1 and tp > 1:
        return _expert_parallel_comm_terms(comm, tp, moe)
    if comm is None or tp <= 1:
        return 0.0, 0.0
    count = comm.num_allreduce_per_layer * comm.num_layers
    fixed = count * comm.alpha_s
    bytes_per_token = comm.hidden_size * comm.dtype_bytes
    per_token = count * 2.0 * (tp - 1) / tp * bytes_per_token / comm.bus_bandwidth_Bps
    return fixed, per_token


def _expert_parallel_comm_terms(comm: CommModel | None, tp: int, moe: MoeCoefficients) -> tuple[float, float]:
    """``_comm_terms`` at ep > 1: each MoE layer's all-reduce gives way to a dispatch and a combine (the
    attention's all-reduce becomes a reduce-scatter before dispatch and an all-gather after combine: the same
    bytes, so it stays priced as one all-reduce)."""
    fixed, per_token = all_to_all_terms(moe, tp)
    if comm is None:
        return fixed, per_token
    one_fixed, one_per_token = _comm_terms(comm.model_copy(update={"num_allreduce_per_layer": 1, "num_layers": 1}),
                                           tp)
    num_allreduces = comm.num_allreduce_per_layer * comm.num_layers - moe.num_moe_layers
    return num_allreduces * one_fixed + fixed, num_allreduces * one_per_token + per_token


def all_to_all_terms(moe: MoeCoefficients, tp: int) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of a step's dispatches and combines at ep > 1: two all-to-alls per
    MoE layer, each α + bytes one GPU sends / its bandwidth, where a GPU holds N/tp of the step's tokens and
    sends each to the ``simulator.cost.moe.dispatch_fanout`` other GPUs holding its experts (hidden x dtype
    bytes a copy)."""
    if moe.ep <= 1 or moe.all_to_all_bandwidth_Bps is None:
        return 0.0, 0.0
    calls = 2 * moe.num_moe_layers
    fanout = routing.dispatch_fanout(moe.num_experts, moe.experts_per_token, moe.ep, tp)
    bytes_per_token = fanout * moe.hidden_size * moe.dtype_bytes / tp
    return calls * moe.all_to_all_alpha_s, calls * bytes_per_token / moe.all_to_all_bandwidth_Bps


class ExpertReads:
    """The routed-expert term of an MoE profile as a function of a step's new tokens N: how many experts the
    busiest GPU reads, R(N), and the term's seconds. Off the per-step path: asked once per distinct N."""

    __slots__ = ("_busiest", "_probabilities", "moe")

    def __init__(self, moe: MoeCoefficients) -> None:
        self.moe = moe
        self._probabilities = routing.inclusion_probabilities(moe.num_experts, moe.experts_per_token, moe.routing,
                                                              moe.zipf_exponent)
        self._busiest = routing.busiest_group_table(moe.num_experts, moe.ep) if moe.ep > 1 else None

    def distinct(self, num_tokens: int) -> float:
        """D(N): expected distinct experts a layer's N tokens touch, over all GPUs."""
        return routing.expected_distinct_experts(num_tokens, self._probabilities)

    def read_by_busiest(self, num_tokens: int) -> float:
        """R(N): experts the busiest GPU reads a share of (D(N) at ep 1, the fullest group's above)."""
        distinct = self.distinct(num_tokens)
        if self._busiest is None:
            return distinct
        return routing.interpolate_table(self._busiest, distinct)

    def time_s(self, num_tokens: int, knee_p: float) -> float:
        """smoothmax(expert_weight_s·R(N), expert_per_token_s·N) with exponent ``knee_p``; 0 for no tokens."""
        if num_tokens <= 0:
            return 0.0
        weight = self.moe.expert_weight_s * self.read_by_busiest(num_tokens)
        compute = self.moe.expert_per_token_s * num_tokens
        return math.pow(math.pow(weight, knee_p) + math.pow(compute, knee_p), 1.0 / knee_p)

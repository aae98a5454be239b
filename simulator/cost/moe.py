"""Mixture-of-experts routing: how many distinct experts a step's tokens touch, which GPU reads the most of
them, and how many GPUs a token is dispatched to.

A decode step of a dense model reads every weight once; a step of an MoE model reads its dense part (attention,
shared experts, leading dense layers, router, LM head) and only the routed experts its N tokens chose. Each
token picks k of the E experts of every MoE layer; expert i is among one token's k with probability π_i
(Σπ_i = k). Tokens route independently, so an expert is touched by none of N tokens with probability
(1 − π_i)^N, and the expected number of distinct experts touched is

    D(N) = Σ_i 1 − (1 − π_i)^N          uniform routing (π_i = k/E):  D(N) = E·(1 − (1 − k/E)^N)

which is k at N = 1 and tends to E as N grows. Two routing distributions (``Routing``):

* ``uniform``: π_i = k/E, what the load-balancing loss of every shipped model trains its router towards.
* ``zipf``: expert popularity follows Zipf's law, π_i ∝ i^−s by popularity rank i = 1..E, scaled so that
  Σπ_i = k; an expert whose share would exceed 1 is chosen by every token (π = 1) and the rest is shared
  among the others in the same proportions. Such inclusion probabilities are realised exactly by systematic
  sampling of k distinct experts. For a fixed k, any unequal π touches fewer distinct experts than uniform
  (1 − (1 − π)^N is concave in π), so skew lowers the weight bytes of a mid-sized step. Measured routing on
  real text sits between the two: per-expert token load Gini 0.105–0.15 (MHA, Mamba-2) and above 0.24 (MLA)
  across five MoE checkpoints (DODOCO, arXiv 2605.20982); ``gini`` gives the coefficient of a Zipf exponent.

Expert parallelism (EP) spreads the E experts over ``ep`` groups of E/ep. A step waits for the GPU that reads
the most experts: ``busiest_group_table`` gives, for d experts touched in all, the expected largest number of
them in one group when the d are spread over the groups as a uniformly random d-subset of the E (exact for
uniform routing at N = 1, where d = k; at large N every group is full). Between whole numbers of d it is
interpolated linearly at D(N), a stated approximation: the spread of D around its mean is not modelled.

``dispatch_fanout`` is the expected number of other GPUs one token's hidden state is sent to by an
all-to-all dispatch (and its partial results received from by the combine), once per destination GPU as
DeepEP's dispatch layout sends it, not once per expert.

Stdlib and numpy only; never imports ``calibration`` or torch. Not on the per-step path: the cost model
asks once per distinct token count and keeps the answer.
"""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np


class Routing(StrEnum):
    UNIFORM = "uniform"
    """Every expert equally likely: π_i = k/E (a router trained with a load-balancing loss)."""
    ZIPF = "zipf"
    """Expert popularity by Zipf's law with exponent s: π_i ∝ i^−s, scaled to Σπ = k, capped at 1."""


def inclusion_probabilities(num_experts: int, experts_per_token: int, routing: Routing = Routing.UNIFORM,
                            zipf_exponent: float = 0.0) -> tuple[float, ...]:
    """π_i: the probability that one token's k experts include expert i, by popularity rank; Σπ_i = k."""
    if not 1 <= experts_per_token <= num_experts:
        raise ValueError(f"experts per token must be in 1..{num_experts}, got {experts_per_token}")
    if zipf_exponent < 0:
        raise ValueError(f"the Zipf exponent must be >= 0, got {zipf_exponent}")
    k, e = experts_per_token, num_experts
    if routing is Routing.UNIFORM or zipf_exponent == 0.0:
        return (k / e,) * e
    weights = [(i + 1) ** -zipf_exponent for i in range(e)]
    # Water-filling: weights fall with the rank, so the experts capped at 1 are a prefix of the ranking.
    num_capped = 0
    while True:
        scale = (k - num_capped) / math.fsum(weights[num_capped:])
        if scale * weights[num_capped] <= 1.0:
            break
        num_capped += 1
    return (1.0,) * num_capped + tuple(min(1.0, scale * w) for w in weights[num_capped:])


def expected_distinct_experts(num_tokens: int, probabilities: tuple[float, ...]) -> float:
    """D(N): expected distinct experts of one MoE layer that ``num_tokens`` tokens touch together."""
    if num_tokens <= 0:
        return 0.0
    first = probabilities[0]
    if all(p == first for p in probabilities):  # uniform: the closed form E·(1 − (1 − k/E)^N)
        return len(probabilities) * (1.0 - (1.0 - first) ** num_tokens)
    return math.fsum(1.0 - (1.0 - p) ** num_tokens for p in probabilities)


def busiest_group_table(num_experts: int, num_groups: int) -> tuple[float, ...]:
    """For d = 0..E experts touched in all, spread as a uniformly random d-subset over ``num_groups`` groups of
    E/num_groups: the expected largest number of them in one group.

    P(max <= j | d) = [x^d] (Σ_{i<=j} C(m, i) x^i)^G / C(E, d), with m = E/G experts per group, G groups: the
    placements of d touched experts that put at most j in every group, over all placements."""
    if num_groups < 1 or num_experts % num_groups:
        raise ValueError(f"{num_groups} groups do not split {num_experts} experts evenly")
    per_group = num_experts // num_groups
    if num_groups == 1:
        return tuple(float(d) for d in range(num_experts + 1))
    binom_m = np.array([math.comb(per_group, i) for i in range(per_group + 1)], dtype=np.float64)
    all_ways = np.array([math.comb(num_experts, d) for d in range(num_experts + 1)], dtype=np.float64)
    expected_max = np.zeros(num_experts + 1, dtype=np.float64)
    for j in range(per_group):  # E[max] = Σ_{j>=0} P(max > j)
        ways: np.ndarray = np.ones(1, dtype=np.float64)
        for _ in range(num_groups):
            ways = np.convolve(ways, binom_m[: j + 1])
        at_most_j = np.zeros(num_experts + 1, dtype=np.float64)
        at_most_j[: len(ways)] = ways[: num_experts + 1]
        expected_max += 1.0 - np.minimum(at_most_j / all_ways, 1.0)
    return tuple(float(x) for x in expected_max)


def interpolate_table(table: tuple[float, ...], x: float) -> float:
    """``table`` (values at 0, 1, 2, ...) at a real ``x``, linearly between whole numbers."""
    if x <= 0.0:
        return table[0]
    last = len(table) - 1
    if x >= last:
        return table[last]
    lo = int(x)
    frac = x - lo
    return table[lo] + frac * (table[lo + 1] - table[lo]) if frac else table[lo]


def dispatch_fanout(num_experts: int, experts_per_token: int, num_groups: int, num_gpus: int) -> float:
    """Expected other GPUs one token is sent to when its k experts live in ``num_groups`` groups of E/groups
    experts, each group's experts split over num_gpus/num_groups GPUs, tokens spread evenly over the GPUs.

    A group holds none of the token's k (uniform) experts with probability h0 = C(E − E/G, k) / C(E, k); every
    GPU of a touched group needs the token, the token's own GPU excepted: (num_gpus − 1)·(1 − h0)."""
    if num_groups <= 1:
        return 0.0
    per_group = num_experts // num_groups
    untouched = math.comb(num_experts - per_group, experts_per_token) / math.comb(num_experts, experts_per_token)
    return (num_gpus - 1) * (1.0 - untouched)


def gini(shares: tuple[float, ...]) -> float:
    """Gini coefficient of a load vector (0 = every expert the same load; DODOCO reports routing this way)."""
    values = sorted(shares)
    n = len(values)
    total = math.fsum(values)
    if n == 0 or total == 0:
        return 0.0
    weighted = math.fsum((2 * (i + 1) - n - 1) * v for i, v in enumerate(values))
    return weighted / (n * total)

"""What a finished run must satisfy, checked once after the clock stops (``fleetsim run --check``; always
on in the test suite through ``$FLEETSIM_CHECK``).

- Every arrived request finished exactly once (the log counts finish events), or is counted rejected, or
  failed (a fleet with failures gave up after its retries: held nowhere, never finished), or in flight (the
  horizon cut it) and then still held by exactly the replica it was routed to (or by the fleet, waiting
  for a ready replica or lost with an undetected crash); without a horizon none is in flight and every
  request of the workload arrived. So arrivals = completed + failed + rejected (+ in flight), exactly.
- Tokens: a completed request produced every token it asked for, an in-flight one fewer (and it has a
  first token exactly when it produced one), a rejected one none.
- KV: on every replica, each block's reference count equals the references the live requests' block
  tables hold, the blocks in use are exactly those referenced (none once nothing is in flight), and the
  host blocks of swapped requests add up.
- Latencies of completed requests are numbers, never negative, and TTFT <= E2E.

A violation is an ``InvariantError``: one line naming the variant, each rule broken, how many requests and
a few of their ids. It means the simulator is wrong, not the input. Costs O(requests + KV blocks) once;
nothing here runs per step. The replicas' end state comes in as plain data (``ReplicaEnd``, built by
``simulation``), so this module imports nothing above ``results``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.errors import one_line
from simulator.results.request_log import RequestLog, RequestOutcome, latencies_s

CHECK_ENV = "FLEETSIM_CHECK"
"""Set to 1 to check every run in this process (the test suite does)."""


def check_requested(check: bool = False) -> bool:
    """Whether to check: asked for, or ``$FLEETSIM_CHECK`` is 1."""
    return check or os.environ.get(CHECK_ENV) == "1"


class InvariantError(Exception):
    """A finished run broke an invariant: a bug in the simulator, not in the scenario."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaEnd:
    """One replica's state when the clock stopped, as plain data."""

    replica: int
    live: Mapping[int, tuple[int, int]]
    """Request id -> (output tokens produced, output tokens asked for) of every request the replica still
    holds (waiting, running or swapped out)."""
    ref_counts: Sequence[int]
    """The block pool's reference count of each block id (ids beyond the list: 0)."""
    table_refs: Sequence[int]
    """How many block tables hold each block id (same indexing): the live requests', and on a prefill worker
    those of finished prefills whose KV the transfer has yet to read."""
    num_blocks: int
    num_used_blocks: int
    """Blocks the pool counts as in use."""
    host_blocks_used: int
    """Host blocks the scheduler counts as holding swapped-out KV."""
    host_blocks_expected: int
    """Host blocks the swapped-out requests' tokens need."""
    tier_problems: Sequence[str] = ()
    """What the replica's KV tiers report broken (``core.kv_tiers.KVTiers.problems``)."""


def check_run(log: RequestLog, ends: Sequence[ReplicaEnd], *, variant: str, num_requests: int,
              horizon: bool, failed: np.ndarray | None = None, pending: Sequence[int] = (),
              undelivered: Sequence[int] = ()) -> None:
    """Raise ``InvariantError`` naming every invariant the run broke; return quietly when all hold.
    ``failed``: requests a fleet with failures gave up on after their retries (per id); ``pending``:
    requests the fleet itself holds at the horizon (waiting at the router for a ready replica, or lost with
    a crashed replica the router has not noticed yet), held there as if by the replica last routed to;
    ``undelivered``: requests whose one token produced has not reached the client by the horizon (a
    disaggregated request's first token, on its way to the decode worker that streams it)."""
    problems = [*_request_problems(log, ends, num_requests=num_requests, horizon=horizon, failed=failed,
                                   pending=pending, undelivered=undelivered),
                *_latency_problems(log), *(p for end in ends for p in _kv_problems(end))]
    if problems:
        raise InvariantError(one_line(f"run check failed ({variant}): {'; '.join(problems)}"))


def _ids(mask: np.ndarray) -> str:
    ids = np.flatnonzero(mask)
    shown = ", ".join(str(i) for i in ids[:3])
    return f"{ids.size} request(s), e.g. id {shown}"


def _request_problems(log: RequestLog, ends: Sequence[ReplicaEnd], *, num_requests: int,
                      horizon: bool, failed: np.ndarray | None = None, pending: Sequence[int] = (),
                      undelivered: Sequence[int] = ()) -> list[str]:
    c = log.columns()
    out = c["output_tokens"]
    produced = c["produced_tokens"]
    masks = log.outcomes()
    completed, in_flight, rejected = (masks[RequestOutcome.COMPLETED], masks[RequestOutcome.IN_FLIGHT],
                                      masks[RequestOutcome.REJECTED])
    arrived = ~np.isnan(c["arrival_s"])
    on_the_way = np.zeros(len(out), dtype=bool)
    on_the_way[np.asarray(undelivered, dtype=np.int64)] = True
    held = np.zeros(len(out), dtype=np.int64)
    held_by = np.full(len(out), -1, dtype=np.int64)
    problems: list[str] = []
    gave_up = np.zeros(len(out), dtype=bool)
    if failed is not None:
        gave_up = failed[: len(out)].copy()
        in_flight = in_flight & ~gave_up
    for rid in pending:
        if 0 <= rid < len(held):
            held[rid] += 1
            held_by[rid] = c["replica"][rid]
        else:
            problems.append(f"the fleet holds request {rid}, which never arrived")
    for end in ends:
        for rid in end.live:
            if 0 <= rid < len(held):
                held[rid] += 1
                held_by[rid] = end.replica
            else:
                problems.append(f"replica {end.replica} holds request {rid}, which never arrived")
    finished = ~np.isnan(c["finish_s"])
    if log.num_finishes != int(finished.sum()):
        problems.append(f"{log.num_finishes} finish events for {int(finished.sum())} finished requests: a request "
                        "finished more than once")
    rules = [
        ("failed yet finished, rejected or held", gave_up & (finished | rejected | (held > 0))),
        ("failed without arriving", gave_up & ~arrived),
        ("rejected yet finished or served", rejected & (finished | ~np.isnan(c["first_token_s"]))),
        ("in flight but held by no replica (lost)", in_flight & (held == 0)),
        ("held by a replica but not in flight in the log", ~in_flight & ~gave_up & (held > 0)),
        ("held by more than one replica", held > 1),
        ("held by a replica other than the one it was routed to", in_flight & (held == 1) & (held_by != c["replica"])),
        ("completed with produced tokens != requested", completed & (produced != out)),
        ("in flight with every token produced, or a negative count", in_flight & ((produced >= out) | (produced < 0))),
        ("in flight with a first token but none produced, or the reverse",
         in_flight & ((produced > 0) != ~np.isnan(c["first_token_s"])) & ~on_the_way),
        ("on its way to the client with a first token, or other than one token produced",
         on_the_way & (~in_flight | (produced != 1) | ~np.isnan(c["first_token_s"]))),
        ("rejected with tokens produced", rejected & (produced != 0)),
    ]
    if not horizon:
        rules.append(("in flight although the run had no horizon", in_flight))
    problems += [f"{name}: {_ids(mask)}" for name, mask in rules if mask.any()]
    if not horizon and int(arrived.sum()) != num_requests:
        problems.append(f"{int(arrived.sum())} of the workload's {num_requests} requests arrived without a horizon")
    return problems


def _latency_problems(log: RequestLog) -> list[str]:
    c = log.columns()
    completed = log.outcomes()[RequestOutcome.COMPLETED]
    lat = latencies_s(c)
    problems = []
    for name in ("queue", "ttft", "e2e"):
        values = lat[name]
        if (bad := completed & ~np.isfinite(values)).any():
            problems.append(f"{name} not a number: {_ids(bad)}")
        if (bad := completed & (values < 0)).any():
            problems.append(f"{name} negative: {_ids(bad)}")
    tpot = lat["tpot"]
    multi = completed & (c["output_tokens"] > 1)
    if (bad := multi & ~(np.isfinite(tpot) & (tpot >= 0))).any():
        problems.append(f"tpot not a non-negative number: {_ids(bad)}")
    with np.errstate(invalid="ignore"):
        if (bad := completed & (lat["ttft"] > lat["e2e"])).any():
            problems.append(f"ttft > e2e: {_ids(bad)}")
    return problems


def _kv_problems(end: ReplicaEnd) -> list[str]:
    size = max(end.num_blocks, len(end.ref_counts), len(end.table_refs))
    refs = np.zeros(size, dtype=np.int64)
    refs[: len(end.ref_counts)] = end.ref_counts
    tables = np.zeros(size, dtype=np.int64)
    tables[: len(end.table_refs)] = end.table_refs
    where = f"replica {end.replica}"
    problems = []
    if (bad := np.flatnonzero(refs != tables)).size:
        problems.append(f"{where}: {bad.size} KV block(s) whose reference count differs from the block tables "
                        f"holding them, e.g. block {bad[0]}: {refs[bad[0]]} vs {tables[bad[0]]}")
    if size > end.num_blocks:
        problems.append(f"{where}: block ids beyond the pool's {end.num_blocks}")
    referenced = int((refs > 0).sum())
    if end.num_used_blocks != referenced:
        problems.append(f"{where}: {end.num_used_blocks} KV blocks in use, {referenced} referenced")
    if not end.live and not any(end.table_refs) and end.num_used_blocks:
        problems.append(f"{where}: {end.num_used_blocks} KV blocks still in use with no request left")
    if end.host_blocks_used != end.host_blocks_expected:
        problems.append(f"{where}: {end.host_blocks_used} host blocks in use, the swapped requests need "
                        f"{end.host_blocks_expected}")
    problems += [f"{where}: {p}" for p in end.tier_problems]
    return problems

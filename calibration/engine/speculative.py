"""Speculative decoding in the real engine: a layer-truncated self-draft proposes, the model verifies greedily.

The core schedules each decode with its proposals (``simulator.core.speculation``) and reserves their KV
slots; this module only fills them. Per step: the drafter runs its proposals one position at a time for
every row that has any, the model runs the step once with each row's last token and its proposals as new
tokens, and greedy verification keeps the leading proposals equal to the model's own argmax plus the
model's token at the first mismatch (or after the last proposal). Every token kept is the model's argmax
given the tokens before it, so the output equals plain greedy decoding token for token; the accepted
counts go to ``Scheduler.update``, which rolls the rest back.

The drafter is the model's own first ``num_layers`` layers with its final norm and LM head (self-speculative
decoding, as LayerSkip and Draft&Verify; an EAGLE head is a one-layer drafter of the same kind). Its layers
are the model's, so the KV it needs for verified tokens is already in the model's cache, and the KV it
writes for its proposals sits in the slots the core reserved, overwritten by the verification: it needs no
cache and no prefill of its own.

Never schedules, allocates or decides acceptance counts other than by comparing tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from calibration.engine.attention import ScheduledSeq, step_positions
from calibration.engine.runner import ModelRunner

if TYPE_CHECKING:
    from calibration.engine.engine import Engine, StepRecord, TokenEvent
    from simulator.core.step import StepPlan


@dataclass(frozen=True, slots=True)
class SpecStepStats:
    """What one speculative step measured."""

    num_rows: int
    """Rows verified with at least one proposal."""
    num_draft_tokens: int
    num_accepted_tokens: int
    draft_s: float
    """Wall clock (synchronised on a GPU) of the drafting passes."""
    verify_s: float
    """Wall clock of the verification forward and its argmax."""
    reached: tuple[int, ...]
    """Per draft position j: rows that verified a proposal at j with every earlier one accepted."""
    accepted_at: tuple[int, ...]
    """Per draft position j: of those, the rows whose proposal at j was accepted."""


class SelfDraft:
    """Proposals from the runner's model cut to its first ``num_layers`` layers."""

    def __init__(self, runner: ModelRunner, num_layers: int) -> None:
        total = runner.shape.num_layers
        if not 1 <= num_layers < total:
            raise ValueError(f"a self-draft needs 1 to {total - 1} of the model's {total} layers, got {num_layers}")
        self.runner = runner
        self.num_layers = num_layers

    def propose(self, seqs: list[ScheduledSeq], last_tokens: list[int], num_drafts: list[int]) -> list[list[int]]:
        """``num_drafts[i]`` greedy proposals for row i, whose cache holds ``seqs[i].num_computed_tokens``
        tokens and whose next input is ``last_tokens[i]`` (the block table must cover the proposals)."""
        runner = self.runner
        drafts: list[list[int]] = [[] for _ in seqs]
        inputs = list(last_tokens)
        with torch.inference_mode():
            for j in range(max(num_drafts, default=0)):
                active = [i for i in range(len(seqs)) if num_drafts[i] > j]
                step = [ScheduledSeq(num_new_tokens=1, num_computed_tokens=seqs[i].num_computed_tokens + j,
                                     block_table=seqs[i].block_table) for i in active]
                ids = torch.as_tensor([inputs[i] for i in active], dtype=torch.int64).to(runner.device)  # (rows,)
                positions = step_positions(step, runner.device)  # (rows,)
                meta = runner.backend.prepare(step)
                logits = runner.model(ids, positions, meta, runner.kv_cache,
                                      num_layers=self.num_layers)  # (rows, vocab)
                for i, token in zip(active, logits.argmax(-1).tolist(), strict=True):
                    drafts[i].append(int(token))
                    inputs[i] = int(token)
        return drafts


def verify(runner: ModelRunner, seqs: list[ScheduledSeq], input_ids: list[int],
           num_spec: list[int]) -> list[list[int]]:
    """One forward of the step; per row the model's argmax after each of its last ``1 + num_spec[i]`` new
    tokens (one for a row without proposals)."""
    with torch.inference_mode():
        ids = torch.as_tensor(input_ids, dtype=torch.int64).to(runner.device)  # (num_tokens,)
        positions = step_positions(seqs, runner.device)  # (num_tokens,)
        meta = runner.backend.prepare(seqs)
        indices: list[int] = []
        end = 0
        for seq, s in zip(seqs, num_spec, strict=True):
            end += seq.num_new_tokens
            indices.extend(range(end - 1 - s, end))
        rows = torch.as_tensor(indices, dtype=torch.int64).to(runner.device)  # (sum of 1 + s,)
        logits = runner.model(ids, positions, meta, runner.kv_cache, token_indices=rows)  # (len(rows), vocab)
        flat = [int(t) for t in logits.argmax(-1).tolist()]
    out: list[list[int]] = []
    start = 0
    for s in num_spec:
        out.append(flat[start : start + 1 + s])
        start += 1 + s
    return out


def _sync(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def speculative_step(engine: Engine, plan: StepPlan, start: float, swap_s: float) -> StepRecord:
    """Run a plan with proposals on ``engine`` (its drafter proposes, its model verifies), update the
    scheduler with the accepted counts and return the step's record."""
    from calibration.engine.engine import TokenEvent

    drafter = engine.drafter
    spec = plan.num_spec_tokens
    if drafter is None or spec is None:
        raise ValueError("a plan with proposals needs an engine built with a drafter (draft_layers)")
    runner, kv, clock = engine.runner, engine.scheduler.kv, engine._clock
    rows = plan.requests
    tables = [kv.block_ids(r.request_id) for r in rows]
    drafted = [i for i in range(len(rows)) if spec[i]]
    t0 = clock()
    proposals = drafter.propose(
        [ScheduledSeq(num_new_tokens=1, num_computed_tokens=plan.num_computed_tokens[i], block_table=tables[i])
         for i in drafted],
        [engine.token_ids[rows[i].request_id][plan.num_computed_tokens[i]] for i in drafted],
        [spec[i] for i in drafted])
    _sync(runner)
    t1 = clock()
    drafts: dict[int, list[int]] = dict(zip(drafted, proposals, strict=True))
    seqs: list[ScheduledSeq] = []
    input_ids: list[int] = []
    for i, request in enumerate(rows):
        n, c = plan.num_new_tokens[i], plan.num_computed_tokens[i]
        known = engine.token_ids[request.request_id][c : c + n - spec[i]]
        seqs.append(ScheduledSeq(num_new_tokens=n, num_computed_tokens=c, block_table=tables[i]))
        input_ids.extend(known + drafts.get(i, []))
    verified = verify(runner, seqs, input_ids, spec) if seqs else []  # a step of swaps alone runs no forward
    _sync(runner)
    t2 = clock()
    now = t2 - engine._t0
    events: list[TokenEvent] = []
    stopped: set[int] = set()
    accepted: list[int] = []
    width = max(spec, default=0)
    reached, accepted_at = [0] * width, [0] * width
    for i, request in enumerate(rows):
        rid = request.request_id
        if not engine._samples(plan, i):
            accepted.append(0)  # a prompt chunk short of the end
            continue
        proposal = drafts.get(i, [])
        num_accepted = 0
        for j, argmax in enumerate(verified[i]):
            token = engine._next_token(rid, argmax)
            engine.token_ids[rid].append(token)
            engine.outputs[rid].append(token)
            events.append(TokenEvent(rid, token, now))
            if token == engine.eos_token_id and not engine._ignore_eos[rid]:
                stopped.add(rid)
                break
            if j < len(proposal):
                reached[j] += 1
            if j < len(proposal) and token == proposal[j]:
                accepted_at[j] += 1
                num_accepted += 1  # the proposal was the model's own token: the next logits are valid
                continue
            break
        accepted.append(num_accepted)
    finished = engine.scheduler.update(plan, stopped, accepted=accepted)
    for request in finished:
        engine._forget(request.request_id)
    engine.spec_stats.append(SpecStepStats(
        num_rows=len(drafted), num_draft_tokens=sum(spec), num_accepted_tokens=sum(accepted),
        draft_s=t1 - t0, verify_s=t2 - t1, reached=tuple(reached), accepted_at=tuple(accepted_at)))
    return engine._record(plan, events, start, t2 - t0, swap_s)


def acceptance_rates(stats: list[SpecStepStats]) -> list[float]:
    """Measured conditional acceptance rate of each draft position (accepted at j over reached j): what a
    scenario's ``acceptance.rates`` takes."""
    width = max((len(s.reached) for s in stats), default=0)
    reached, accepted = [0] * width, [0] * width
    for s in stats:
        for j in range(len(s.reached)):
            reached[j] += s.reached[j]
            accepted[j] += s.accepted_at[j]
    return [a / r if r else float("nan") for a, r in zip(accepted, reached, strict=True)]

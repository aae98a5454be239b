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

The engine (`Engine._step_speculative`) runs a step with proposals through these and keeps the books;
nothing here schedules, allocates or decides acceptance other than by comparing tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibration.engine.attention import ScheduledSeq, step_positions
from calibration.engine.runner import ModelRunner


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


def sync(runner: ModelRunner) -> None:
    """Wait for the device (a GPU runs asynchronously; the timings need the work done)."""
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


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

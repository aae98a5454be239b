"""The price of one step with proposals: the target's verification of every row's new tokens plus the
drafting passes (``cost.speculation`` has the settings and the model behind it). Its own module so that it is
compiled with the per-step path (``native.MODULES``): interpreted, it was 40 % of a speculative run's
instructions once the acceptance draws were compiled."""

from simulator.core.speculation import Speculation, verify_shape_fields
from simulator.core.step import StepPlan
from simulator.cost.cost_model import CostModel


def speculative_step_s(cost: CostModel, plan: StepPlan, speculation: Speculation) -> tuple[float, int]:
    """Seconds of a step with proposals (verification plus drafting) and its prompt tokens."""
    seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap = verify_shape_fields(plan)
    step_s = cost.time_of(seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap)
    fraction = speculation.draft_cost_fraction
    spec = plan.num_spec_tokens
    if fraction > 0 and spec is not None:
        num_rows = ctx = passes = 0
        for i, s in enumerate(spec):
            if s:
                num_rows += 1
                ctx += plan.num_computed_tokens[i] + 1
                passes = max(passes, s)
        if num_rows:
            # Each pass drafts one token for every row still drafting; priced at the widest pass.
            step_s += passes * fraction * cost.time_of(num_rows, num_rows, num_rows, ctx, 0, 0.0, 0)
    return step_s, prefill_tokens

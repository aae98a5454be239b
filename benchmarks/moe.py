"""Decode step time by batch for the shipped MoE profiles beside dense ones: ``python benchmarks/moe.py``.

For each profile and decode batch B (every sequence at 1,024 tokens of context) it prints the device time of
the step, the experts the busiest GPU reads per MoE layer R(B) (k at B = 1, all E at large B; the fullest
expert group's under EP) and the weight bytes one GPU streams: where an MoE model's step stops reading only
its active experts and starts reading all of them. Every profile here is analytic (no MoE timings are
published); the numbers are the cost model's, not measurements.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile

PROFILES = (
    "h200-llama-3-8b-tp1-analytic",
    "h200-qwen3-30b-a3b-tp1-analytic",
    "h200-qwen3-30b-a3b-tp2-analytic",
    "h200-qwen3-30b-a3b-tp2-ep2-analytic",
    "h200-mixtral-8x7b-tp2-analytic",
    "h200-llama-3-70b-tp4-analytic",
    "h200-deepseek-v3-tp8-analytic",
    "h200-deepseek-v3-tp8-ep8-analytic",
)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT = 1024


def weight_gb_read(model: CostModel, batch: int) -> float:
    """GB of weights one GPU streams in a decode step of ``batch``: the dense part and R(B) experts' shares
    (both terms priced at the same achieved bandwidth, expert_bytes / expert_weight_s)."""
    profile, reads = model.profile, model._experts
    moe = profile.moe
    if moe is None or reads is None or not moe.expert_weight_s:
        return profile.memory.weight_bytes / 1e9
    bandwidth = moe.expert_bytes / moe.expert_weight_s
    return (profile.device_s.weight_s * bandwidth + moe.expert_bytes * reads.read_by_busiest(batch)) / 1e9


def main() -> int:
    print(f"decode step device time (ms) by batch, {CONTEXT} tokens of context per sequence")
    print(f"{'profile':40s}" + "".join(f"{b:>8d}" for b in BATCHES))
    for name in PROFILES:
        model = CostModel(load_profile(name))
        times = [model.device_time(StepShape(b, b, b, CONTEXT * b, 0, 0.0)) * 1e3 for b in BATCHES]
        print(f"{name:40s}" + "".join(f"{t:8.2f}" for t in times))
        reads = model._experts
        if reads is not None:
            print(f"{'  experts read by the busiest GPU':40s}" + "".join(f"{reads.read_by_busiest(b):8.1f}"
                                                                        for b in BATCHES))
            print(f"{'  weight GB one GPU streams':40s}" + "".join(f"{weight_gb_read(model, b):8.1f}"
                                                                 for b in BATCHES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

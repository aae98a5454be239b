"""The training run of the profile-guided native build (``simulator.native``): a mix of small simulations
that takes the compiled hot path down the branches real scenarios take, so that the C compiler lays out and
inlines the code for them.

The mix covers the shapes people simulate, not one benchmark: chat without a prefix cache, multi-turn
sessions with vLLM's defaults (prefix caching, chunked prefill, async scheduling) routed by session affinity
and by prefix, the same at three times the load on a small KV pool (preemptions), the step-by-step reference
path, speculative decoding, prefill and decode pools, and KV tiers. Every workload is synthetic (no trace
files) and seeded; the profiles are shipped ones. A profile only steers code layout and inlining: the
compiled code computes the same results whatever the training ran (a test compares them with pure Python).

Run as ``python -m simulator.native_training`` from the scratch folder of a build, with the instrumented
extensions importable (the build does this); exits non-zero if the compiled modules are not the ones in use,
since a profile of pure Python would be empty.
"""

from __future__ import annotations

import sys
from typing import Any

_PROFILE = "h200-llama-3-8b-tp1-analytic"


def _chat(num_requests: int, replicas: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": "train-chat",
        "seed": 1,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate_rps": 8.0 * replicas},
            "prompt_tokens": {"dist": "lognormal", "median": 1000, "sigma": 1.0, "max": 8000},
            "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.9, "max": 1500},
        },
        "fleet": {"replicas": replicas, "profile": _PROFILE},
        "engine": {"preset": "vllm", "prefix_caching": False},
        "router": {"policy": "least_requests"},
        "simulation": {"sample_interval_s": 10.0},
    }


def sessions_workload(num_requests: int, rate_rps: float) -> dict[str, Any]:
    """The realistic case's workload: multi-turn sessions (2 to 6 turns, 10 s of thought between them)
    sharing 8 system prompts of 600 tokens (the routing.yaml shape), sessions arriving at ``rate_rps``. One
    copy for the training and for ``benchmarks/sim_speed.py``'s realistic cases: the build is trained on
    what that benchmark measures."""
    return {
        "num_requests": num_requests,
        "arrival": {"process": "poisson", "rate_rps": rate_rps},
        "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 2000},
        "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 1500},
        "system_prompts": {"num_prompts": 8, "tokens": 600},
        "sessions": {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_time_s": 10,
                     "response_time_estimate_s": 4},
    }


def _sessions(num_requests: int, replicas: int, router: str = "session_affinity",
              load: float = 1.0) -> dict[str, Any]:
    raw = _chat(num_requests, replicas)
    raw["name"] = "train-sessions"
    raw["workload"] = sessions_workload(num_requests, 2.0 * replicas * load)
    raw["engine"] = {"preset": "vllm"}
    raw["router"] = {"policy": router}
    return raw


def _overload(num_requests: int, replicas: int) -> dict[str, Any]:
    raw = _sessions(num_requests, replicas, load=3.0)
    raw["engine"] = {"preset": "vllm", "kv": {"num_blocks": 1500}, "max_num_seqs": 128}
    return raw


def _speculative(num_requests: int, replicas: int) -> dict[str, Any]:
    raw = _chat(num_requests, replicas)
    raw["engine"] = {"preset": "vllm", "async_scheduling": False, "prefix_caching": False,
                     "speculative": {"method": "draft_model", "num_speculative_tokens": 4, "acceptance_rate": 0.7,
                                     "draft_cost_fraction": 0.05}}
    return raw


def _disaggregated(num_requests: int) -> dict[str, Any]:
    raw = _sessions(num_requests, 2)
    raw["router"] = {"policy": "least_requests"}
    raw["fleet"] = {"profile": _PROFILE, "pools": {"prefill": {"role": "prefill", "replicas": 1},
                                                   "decode": {"role": "decode", "replicas": 2}}}
    return raw


def _tiers(num_requests: int) -> dict[str, Any]:
    raw = _sessions(num_requests, 2)
    raw["engine"] = {"preset": "vllm", "kv": {"num_blocks": 2000}}
    raw["kv_tiers"] = {"tiers": [{"name": "host", "kind": "host", "capacity_gib": 2, "read_gb_s": 50,
                                  "write_gb_s": 50, "latency_us": 5}]}
    return raw


def scenarios() -> list[tuple[str, dict[str, Any], list[str]]]:
    """(label, scenario mapping, overrides) of each training simulation."""
    return [
        ("chat", _chat(12_000, 16), []),
        ("sessions, session affinity", _sessions(8_000, 16), []),
        ("sessions, prefix-aware", _sessions(4_000, 16, router="prefix_aware"), []),
        ("sessions, overloaded", _overload(4_000, 16), []),
        ("sessions, step by step", _sessions(1_500, 4), ["simulation.fast_path=false"]),
        ("chat, step by step", _chat(1_500, 4), ["simulation.fast_path=false"]),
        ("speculative decoding", _speculative(2_000, 4), []),
        ("prefill and decode pools", _disaggregated(1_500), []),
        ("KV tiers", _tiers(1_500), []),
    ]


def main() -> int:
    from simulator import native
    from simulator.core import scheduler
    from simulator.scenario import load_mapping
    from simulator.simulation import run

    if not (scheduler.__file__ or "").endswith(native.extension_suffix()):
        print(f"native training: the compiled modules are not in use ({scheduler.__file__})", file=sys.stderr)
        return 1
    for _label, raw, overrides in scenarios():
        run(load_mapping(raw, overrides))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

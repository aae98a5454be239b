"""Engine presets: the scheduler knobs set as the engines our users run set them by default.

Each preset is a partial configuration (the KV pool size always comes from the profile or the engine's
measured memory). A scenario may start from a preset and override any knob. Sources are the engines'
own defaults as documented or coded at the versions named.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from simulator.core.config import Batching, KVPolicy, Preemption, SchedulerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    name: str
    description: str
    source: str
    """Where each default comes from."""
    knobs: dict[str, Any]
    """SchedulerConfig field -> value."""

    def apply(self, config: SchedulerConfig) -> SchedulerConfig:
        return replace(config, **self.knobs)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="vllm",
            description="vLLM v1: chunked prefill, paged KV (block 16), prefix caching, recompute preemption, "
            "async scheduling",
            source=(
                "vllm/engine/arg_utils.py get_batch_defaults (H100/H200-class GPUs, API server: "
                "max_num_batched_tokens 8192, max_num_seqs 1024; a scenario resolves them per GPU and entry "
                "point); block_size 16 (CacheConfig); chunked prefill and prefix caching on by default in v1; "
                "v1 preempts by recompute only; async scheduling on unless incompatible (vllm/config/vllm.py "
                "at 000fc94b: SchedulerConfig.async_scheduling None resolves to True; calibration/engines.yaml "
                "default_source has the release history)"
            ),
            knobs=dict(
                batching=Batching.CHUNKED, kv_policy=KVPolicy.PAGED, preemption=Preemption.RECOMPUTE,
                block_size=16, max_num_batched_tokens=8192, max_num_seqs=1024,
                enable_prefix_caching=True, enable_chunked_prefill=True, long_prefill_token_threshold=0,
                async_scheduling=True,
            ),
        ),
        Preset(
            name="tgi",
            description="TGI: prefill-priority continuous batching gated by the waiting-served ratio, "
            "KV reserved for prompt + max new tokens",
            source=(
                "text-generation-launcher defaults: --waiting-served-ratio 0.3, --max-waiting-tokens 20, "
                "--max-batch-prefill-tokens 4096; the router's queue admits an entry only when blocks for "
                "input_length + max_new_tokens are free (router v3 queue next_batch); block size 16 for "
                "paged attention; prefix caching on by default since TGI 3.0"
            ),
            knobs=dict(
                batching=Batching.CONTINUOUS, kv_policy=KVPolicy.RESERVE, preemption=Preemption.RECOMPUTE,
                block_size=16, max_num_batched_tokens=4096, max_num_seqs=1024,
                waiting_served_ratio=0.3, max_waiting_steps=20, enable_prefix_caching=True,
            ),
        ),
        Preset(
            name="trtllm",
            description="TensorRT-LLM: in-flight batching, capacity policy GUARANTEED_NO_EVICT (reserve), "
            "whole contexts (chunked context off), block reuse on",
            source=(
                "TensorRT-LLM BuildConfig defaults max_batch_size 2048, max_num_tokens 8192; "
                "KvCacheConfig tokens_per_block 64 (trtllm-build default), enable_block_reuse true; "
                "CapacitySchedulerPolicy default GUARANTEED_NO_EVICT; enable_chunked_context false"
            ),
            knobs=dict(
                batching=Batching.CHUNKED, kv_policy=KVPolicy.RESERVE, preemption=Preemption.RECOMPUTE,
                block_size=64, max_num_batched_tokens=8192, max_num_seqs=2048,
                enable_prefix_caching=True, enable_chunked_prefill=False,
            ),
        ),
        Preset(
            name="trtllm-max-util",
            description="TensorRT-LLM with capacity policy MAX_UTILIZATION: paged KV, preempts on OOM",
            source="as trtllm, with CapacitySchedulerPolicy.MAX_UTILIZATION (pauses requests on KV pressure)",
            knobs=dict(
                batching=Batching.CHUNKED, kv_policy=KVPolicy.PAGED, preemption=Preemption.RECOMPUTE,
                block_size=64, max_num_batched_tokens=8192, max_num_seqs=2048,
                enable_prefix_caching=True, enable_chunked_prefill=False,
            ),
        ),
    )
}

_FIELDS = {f.name for f in fields(SchedulerConfig)}
for _preset in PRESETS.values():
    _unknown = set(_preset.knobs) - _FIELDS
    if _unknown:  # a typo in a preset is a bug in this file, caught at import
        raise RuntimeError(f"preset {_preset.name} sets unknown knobs {sorted(_unknown)}")

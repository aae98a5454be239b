"""A profile repriced for other data types: ``fleet.weight_dtype`` and ``engine.kv.dtype`` in a scenario.

A profile is made for one weight dtype and one KV dtype (bf16 for every shipped one). Asked for others, the
simulator reprices it by these rules, and the profile's label says it was repriced:

* **KV cache** (bfloat16 / float16 / fp8): bytes per token scale by the element size, and so does the
  context term ``k`` (decode attention streams the KV bytes). Prefill attention (``q``) stays: vLLM
  dequantizes an fp8 cache to the 16-bit compute type. The pool's bytes are unchanged, so its capacity in
  tokens grows by the inverse ratio (plus what smaller weights free).
* **Weights** (bfloat16 / float16 / fp8 / int4): the linear layers' bytes scale by ``r_b`` (bytes per
  parameter over 2) and their GEMM rate by the accelerator's tensor-core ratio (``dtypes.gemm_rate_ratio``:
  fp8 where the tensor cores have it, else weight-only at the 16-bit rate). The analytic form scales its
  weight stream ``W`` by ``r_b`` and its per-token compute ``f`` by ``1/ratio``. A measured token curve t(N)
  is split by its own floor W = t(first knot): the part W·(W/t) of each knot is weight-stream bound (all of
  it at one token, fading as compute takes over) and scales by ``r_b``, the rest by ``1/ratio``, i.e.
  ``t' = r_b·W²/t + (t − W²/t)/ratio``: the whole curve at one token, the compute-bound slope at
  thousands, and the curve itself when both ratios are 1. Freed weight bytes go to the KV pool. The LM head,
  norms and all-reduces keep their 16-bit cost. The routed experts of an MoE profile are linear layers
  too: their bytes and read time scale by ``r_b``, their compute by ``1/ratio``; dispatched activations stay.

Device-free: the scenario loader calls it with the accelerator's datasheet row.
"""

from __future__ import annotations

from simulator.cost import dtypes
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.profile import Accelerator, Profile


def repriced_curve(curve: PiecewiseLinear, bytes_ratio: float, rate_ratio: float) -> PiecewiseLinear:
    floor = curve.y[0]
    values = []
    for t in curve.y:
        weight_bound = floor * floor / t if t > 0 else 0.0
        values.append(bytes_ratio * weight_bound + (t - weight_bound) / rate_ratio)
    for i in range(1, len(values)):  # keep it non-decreasing, as the fit made it
        values[i] = max(values[i], values[i - 1])
    return PiecewiseLinear(x=curve.x, y=tuple(values))


def at_dtypes(profile: Profile, hw: Accelerator, *, weight_dtype: WeightDtype | None = None,
              kv_dtype: KvDtype | None = None) -> Profile:
    """``profile`` priced for ``weight_dtype`` weights and a ``kv_dtype`` KV cache (None: as it is)."""
    old_weight = WeightDtype(profile.dtype)
    old_kv = KvDtype(profile.kv_dtype or dtypes.default_kv_dtype(old_weight))
    new_weight = weight_dtype or old_weight
    new_kv = kv_dtype or old_kv
    if new_weight is old_weight and new_kv is old_kv:
        return profile
    mem = profile.memory
    dev = profile.device_s
    kv_ratio = dtypes.kv_bytes_per_element(new_kv) / dtypes.kv_bytes_per_element(old_kv)
    bytes_ratio = dtypes.weight_bytes_per_param(new_weight) / dtypes.weight_bytes_per_param(old_weight)
    rate_ratio = dtypes.gemm_rate_ratio(hw, new_weight) / dtypes.gemm_rate_ratio(hw, old_weight)
    linear = mem.linear_weight_bytes if mem.linear_weight_bytes is not None else mem.weight_bytes
    freed = int(linear * (1.0 - bytes_ratio))
    kv_bytes = max(1, round(mem.kv_bytes_per_token * kv_ratio))
    pool_bytes = mem.kv_capacity_tokens * mem.kv_bytes_per_token + freed
    memory = mem.model_copy(update={
        "kv_bytes_per_token": kv_bytes,
        "kv_capacity_tokens": max(0, pool_bytes // kv_bytes),
        "weight_bytes": mem.weight_bytes - freed,
        "linear_weight_bytes": linear - freed,
    })
    device_update: dict[str, object] = {"per_ctx_token_s": dev.per_ctx_token_s * kv_ratio}
    if dev.token_curve is not None:
        curve = repriced_curve(dev.token_curve, bytes_ratio, rate_ratio)
        device_update.update(token_curve=curve, weight_s=curve.y[0], per_token_s=curve.last_slope)
    else:
        device_update.update(weight_s=dev.weight_s * bytes_ratio, per_token_s=dev.per_token_s / rate_ratio)
    moe = profile.moe
    if moe is not None:
        moe = moe.model_copy(update={
            "expert_bytes": int(moe.expert_bytes * bytes_ratio),
            "expert_weight_s": moe.expert_weight_s * bytes_ratio,
            "expert_per_token_s": moe.expert_per_token_s / rate_ratio,
        })
    rule = (f"from {old_weight.value} weights / {old_kv.value} KV: KV bytes x {kv_ratio:.3g}, linear weight "
            f"bytes x {bytes_ratio:.3g}, GEMM rate x {rate_ratio:.3g} on {hw.full_name} (simulator.cost.reprice)")
    return profile.model_copy(update={
        "dtype": new_weight.value,
        "kv_dtype": new_kv.value if new_kv.value != new_weight.value else None,
        "device_s": dev.model_copy(update=device_update),
        "memory": memory,
        "moe": moe,
        "repriced": rule,
    })

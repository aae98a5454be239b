"""Data types: what a weight or a KV element costs in bytes, and what a weight dtype does to the GEMM rate.

The vocabulary is closed (``StrEnum``): weights in ``bfloat16``, ``float16``, ``fp8`` or ``int4``
(weight-only W4A16: half a byte per weight plus one 16-bit scale per group of ``INT4_GROUP_SIZE``), the
KV cache in a 16-bit dtype or ``fp8``. Activations stay 16-bit in every case. Only the linear layers of
the decoder are quantized: vLLM's fp8, GPTQ and AWQ loaders keep the embedding, the LM head and the norms
in 16 bits, and so does this pricing (a vLLM v0.19.0 log of Llama-3.1-8B with ``--quantization fp8``
reports 8.49 GiB of weights, which is 6.98 G linear weights at 1 byte + 1.05 G others at 2 bytes).

Stdlib plus ``profile`` (for the accelerator's tensor rates) only; never imports ``calibration``.
"""

from __future__ import annotations

from enum import StrEnum

from simulator.cost.profile import Accelerator
from simulator.errors import ConfigError


class WeightDtype(StrEnum):
    BFLOAT16 = "bfloat16"
    """16-bit brain float: 2 bytes a weight, GEMMs at the BF16 tensor-core rate."""
    FLOAT16 = "float16"
    """IEEE half: 2 bytes a weight, GEMMs at the (equal) FP16 tensor-core rate."""
    FP8 = "fp8"
    """8-bit float (E4M3): 1 byte a weight; W8A8 at the FP8 rate where the tensor cores have one,
    else weight-only W8A16 (weights dequantized to 16 bits, GEMMs at the BF16 rate)."""
    INT4 = "int4"
    """Weight-only W4A16 (GPTQ/AWQ-style): half a byte a weight plus group scales; GEMMs at the 16-bit rate."""


class KvDtype(StrEnum):
    BFLOAT16 = "bfloat16"
    """2 bytes per K or V element (vLLM's ``kv_cache_dtype=auto`` for a bf16 model)."""
    FLOAT16 = "float16"
    """2 bytes per element (``auto`` for a float16 model)."""
    FP8 = "fp8"
    """1 byte per element (vLLM's ``--kv-cache-dtype fp8``): twice the tokens in the same pool."""


ACTIVATION_BYTES = 2
"""Bytes per activation element: every weight dtype here runs with 16-bit activations."""

UNQUANTIZED_BYTES = 2
"""Bytes per parameter of the layers no dtype quantizes (embedding, LM head, norms)."""

INT4_GROUP_SIZE = 128
"""Weights sharing one scale in W4A16 (the GPTQ/AWQ default)."""

INT4_SCALE_BYTES = 2
"""Bytes of one W4A16 group scale (float16)."""

_WEIGHT_BYTES: dict[WeightDtype, float] = {
    WeightDtype.BFLOAT16: 2.0,
    WeightDtype.FLOAT16: 2.0,
    WeightDtype.FP8: 1.0,
    WeightDtype.INT4: 0.5 + INT4_SCALE_BYTES / INT4_GROUP_SIZE,
}

_KV_BYTES: dict[KvDtype, int] = {KvDtype.BFLOAT16: 2, KvDtype.FLOAT16: 2, KvDtype.FP8: 1}


def parse_weight_dtype(name: str, *, field: str = "dtype") -> WeightDtype:
    """``name`` as a WeightDtype; anything else is a ConfigError listing the known ones."""
    try:
        return WeightDtype(name)
    except ValueError:
        known = ", ".join(WeightDtype)
        raise ConfigError(f"no pricing for weight dtype {name!r}; known: {known}", field=field) from None


def parse_kv_dtype(name: str, *, field: str = "kv_dtype") -> KvDtype:
    """``name`` as a KvDtype; anything else is a ConfigError listing the known ones."""
    try:
        return KvDtype(name)
    except ValueError:
        known = ", ".join(KvDtype)
        raise ConfigError(f"no pricing for KV dtype {name!r}; known: {known}", field=field) from None


def default_kv_dtype(weight_dtype: WeightDtype) -> KvDtype:
    """vLLM's ``kv_cache_dtype=auto``: the model's 16-bit activation dtype (float16 only for a float16 model)."""
    return KvDtype.FLOAT16 if weight_dtype is WeightDtype.FLOAT16 else KvDtype.BFLOAT16


def weight_bytes_per_param(dtype: WeightDtype) -> float:
    """Bytes one quantizable (linear-layer) weight occupies, scales included."""
    return _WEIGHT_BYTES[dtype]


def kv_bytes_per_element(dtype: KvDtype) -> int:
    """Bytes of one K or V element in the cache."""
    return _KV_BYTES[dtype]


def weight_bytes(num_linear_params: int, num_other_params: int, dtype: WeightDtype) -> int:
    """Resident weight bytes: linear layers at ``dtype``, the rest (embedding, LM head, norms) at 16 bits."""
    return int(num_linear_params * weight_bytes_per_param(dtype)) + num_other_params * UNQUANTIZED_BYTES


def gemm_rate_ratio(hw: Accelerator, dtype: WeightDtype) -> float:
    """Dense tensor-core rate of the linear layers' GEMMs at ``dtype``, relative to BF16.

    FP8 runs W8A8 at the FP8 rate on tensor cores that have one (Hopper, Ada, Blackwell); without them
    (Ampere) vLLM runs FP8 checkpoints weight-only, W8A16, so the bytes halve and the rate stays BF16's.
    INT4 is weight-only W4A16: dequantized in the kernel, multiplied at the 16-bit rate."""
    if dtype is WeightDtype.FP8 and hw.dense_fp8_flops is not None:
        return hw.dense_fp8_flops / hw.dense_bf16_flops
    return 1.0

"""Paged decode attention as our own Triton kernel (CUDA), with SDPA-gather for prompt chunks.

Decode is where a step's time goes to reading the KV cache, so decode rows read pages in place: no gather
copy. The kernel is "flash decoding" for GQA: one program per (sequence, KV head, context split) loads each
K/V page once for all query heads of its group, keeps an online softmax in fp32, and writes a partial
result with its log-sum-exp; a second kernel merges the splits. Splitting the context keeps the GPU busy
when the batch is small and contexts are long. Inputs may be bf16; scores and accumulators are fp32.

Rows that prefill (a prompt, or a chunk over a cached prefix) go through the gather path of
``SdpaGatherBackend`` in the same step.

Triton is imported on first use only, so this module imports (and the registry lists it) without triton.
Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how CPU CI checks its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from calibration.engine.attention.base import ScheduledSeq, write_kv
from calibration.engine.attention.sdpa_gather import GatherMetadata, SdpaGatherBackend

tl: Any = None
"""``triton.language``, bound by ``_kernels()``; the kernel bodies below resolve it as a module global."""
_KERNELS: tuple[Any, Any] | None = None


def _kernels() -> tuple[Any, Any]:
    """JIT-wrap the kernels on first use (imports triton then, never at module import)."""
    global tl, _KERNELS
    if _KERNELS is None:
        import triton
        import triton.language

        tl = triton.language
        _KERNELS = (triton.jit(_decode_split_kernel), triton.jit(_merge_splits_kernel))
    return _KERNELS


def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
    scale, pages_per_split,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_bt,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    IEEE: tl.constexpr,
):  # type: ignore[no-untyped-def]
    """One (sequence, KV head, split): online softmax over pages [split * pps, (split + 1) * pps)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_pages = tl.cdiv(seq_len, BLOCK_SIZE)
    page_lo = split * pages_per_split
    page_hi = tl.minimum(page_lo + pages_per_split, num_pages)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_SIZE)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    # The group is padded to GROUP_PAD rows because tl.dot needs at least 16 rows on a GPU.
    q_off = seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_mask[:, None], other=0.0)  # (GROUP_PAD, HEAD_DIM)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for page in range(page_lo, page_hi):
        block = tl.load(block_tables_ptr + seq * stride_bt + page).to(tl.int64)
        n_mask = page * BLOCK_SIZE + offs_n < seq_len
        kv_off = block * stride_kb + offs_n[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=n_mask[:, None], other=0.0)  # (BLOCK_SIZE, HEAD_DIM)
        # fp32 inputs would default to TF32 on a GPU; the fp32 path is the exact reference, so ask for IEEE.
        if IEEE:  # noqa: SIM108 (a Triton constexpr branch, resolved at compile time)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")  # (GROUP_PAD, BLOCK_SIZE)
        else:
            s = tl.dot(q, tl.trans(k))  # (GROUP_PAD, BLOCK_SIZE)
        s = tl.where(n_mask[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=n_mask[:, None], other=0.0)  # (BLOCK_SIZE, HEAD_DIM)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # An empty split (context shorter than its range) leaves l = 0: output 0 with lse -inf, weight 0 later.
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    base = seq * stride_pb + heads * stride_ph + split * stride_ps
    tl.store(part_out_ptr + base[:, None] + offs_d[None, :], out, mask=g_mask[:, None])
    tl.store(part_lse_ptr + seq * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # type: ignore[no-untyped-def]
    """One (sequence, query head): weight each split's partial output by its share of the softmax mass."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < num_splits
    lse = tl.load(
        part_lse_ptr + seq * stride_lb + head * stride_lh + offs_s, mask=s_mask, other=float("-inf")
    )  # (SPLITS_PAD,)
    w = tl.exp(lse - tl.max(lse, 0))
    w = w / tl.sum(w, 0)
    parts = tl.load(
        part_out_ptr + seq * stride_pb + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )  # (SPLITS_PAD, HEAD_DIM)
    out = tl.sum(parts * w[:, None], 0)  # (HEAD_DIM,)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def compile_kernels(
    *, arch: int = 90, dtype: str = "bf16", group: int = 4, head_dim: int = 128, block_size: int = 16
) -> dict[str, bytes]:
    """Compile both kernels ahead of time for CUDA compute capability ``arch``, without a GPU.

    Returns the cubins by kernel name. Lets CPU CI (and a device script, before it spends device time)
    catch what the interpreter forgives, such as tl.dot shape rules. Must run in a process where
    TRITON_INTERPRET was not set when triton was imported.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    _kernels()
    specs: dict[str, tuple[Any, dict[str, str], dict[str, int | bool]]] = {
        "decode": (
            _decode_split_kernel,
            {"q_ptr": dtype, "k_ptr": dtype, "v_ptr": dtype, "block_tables_ptr": "i32", "seq_lens_ptr": "i32"},
            {
                "GROUP": group, "GROUP_PAD": max(16, _next_pow2(group)), "HEAD_DIM": head_dim,
                "BLOCK_SIZE": block_size, "IEEE": dtype == "fp32",
            },
        ),
        "merge": (_merge_splits_kernel, {"out_ptr": dtype}, {"HEAD_DIM": head_dim, "SPLITS_PAD": 8}),
    }
    cubins = {}
    for name, (fn, pointers, constants) in specs.items():
        jit = JITFunction(fn)
        signature = {arg: "i32" for arg in jit.arg_names}  # strides and counts
        signature.update({arg: "*fp32" for arg in jit.arg_names if arg.endswith("_ptr")})
        signature.update({arg: f"*{t}" for arg, t in pointers.items()})
        signature.update({arg: "fp32" for arg in ("scale",) if arg in signature})
        signature.update({arg: "constexpr" for arg in constants})
        constexprs = {(jit.arg_names.index(arg),): value for arg, value in constants.items()}
        source = ASTSource(jit, signature, constexprs)
        cubins[name] = triton.compile(source, target=GPUTarget("cuda", arch, 32)).asm["cubin"]
    return cubins


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    num_splits: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    q: (num_seqs, num_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim);
    block_tables: (num_seqs, max_blocks) int32; seq_lens: (num_seqs,) int32, each >= 1. Returns
    (num_seqs, num_heads, head_dim) in q's dtype. ``num_splits`` is a launch constant (not derived from the
    lengths on the device) so the call can be captured in a CUDA graph.
    """
    decode_kernel, merge_kernel = _kernels()
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads or head_dim & (head_dim - 1):
        raise ValueError(f"need num_heads % num_kv_heads == 0 and a power-of-two head_dim, got {q.shape}")
    if q.is_cuda and (block_size < 16 or head_dim < 16):
        raise ValueError(f"tl.dot needs block_size and head_dim >= 16 on a GPU, got {block_size}, {head_dim}")
    if k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("the head_dim axis of q and the cache must be contiguous")
    group = num_heads // num_kv_heads
    max_blocks = block_tables.shape[1]
    pages_per_split = max(1, -(-max_blocks // num_splits))
    num_splits = -(-max_blocks // pages_per_split) if max_blocks else 1
    part_out = torch.empty(
        (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )  # (num_seqs, num_heads, num_splits, head_dim)
    part_lse = torch.empty(
        (num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device
    )  # (num_seqs, num_heads, num_splits)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse,
        scale, pages_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, GROUP_PAD=max(16, _next_pow2(group)), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        IEEE=q.dtype == torch.float32,
    )
    merge_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, num_splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLITS_PAD=max(2, _next_pow2(num_splits)),
    )
    return out


@dataclass(slots=True, kw_only=True)
class TritonPagedMetadata(GatherMetadata):
    decode_seqs: list[int]
    """Indices of the sequences with one new token: they go through the Triton kernel."""
    decode_token_indices: torch.Tensor
    """(num_decode,) int64 flat token index of each decode row."""
    block_tables: torch.Tensor
    """(num_decode, max_blocks) int32 block tables of the decode sequences, padded with 0 (never read)."""
    seq_lens: torch.Tensor
    """(num_decode,) int32 context length after the step of each decode sequence."""
    num_splits: int


class TritonPagedBackend(SdpaGatherBackend):
    """Decode rows: our Triton split-KV kernel over the pool in place. Prefill rows: SDPA over gathers."""

    name = "triton_paged"

    def __init__(
        self, *, block_size: int = 16, device: torch.device | str = "cuda", target_pages_per_split: int = 32
    ) -> None:
        """``target_pages_per_split``: context pages one program walks before the work splits further."""
        super().__init__(block_size=block_size, device=device)
        self.target_pages_per_split = target_pages_per_split

    def prepare(self, seqs: Sequence[ScheduledSeq]) -> TritonPagedMetadata:
        common = self._paged_common(seqs)
        decode = [i for i, s in enumerate(seqs) if s.num_new_tokens == 1]
        prefill = [i for i, s in enumerate(seqs) if s.num_new_tokens > 1]
        pages = [-(-seqs[i].seq_len // self.block_size) for i in decode]
        max_pages = max(pages, default=1)
        tables = torch.zeros((len(decode), max_pages), dtype=torch.int32)  # (num_decode, max_blocks)
        for row, (i, n) in enumerate(zip(decode, pages, strict=True)):
            tables[row, :n] = torch.as_tensor(list(seqs[i].block_table[:n]), dtype=torch.int32)
        starts = common["query_start"]
        return TritonPagedMetadata(
            **common,
            **self._gather_fields(seqs, prefill),
            decode_seqs=decode,
            decode_token_indices=torch.tensor([starts[i] for i in decode], dtype=torch.int64).to(self.device),
            block_tables=tables.to(self.device),
            seq_lens=torch.tensor([seqs[i].seq_len for i in decode], dtype=torch.int32).to(self.device),
            num_splits=max(1, -(-max_pages // self.target_pages_per_split)),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor | None,
        meta: GatherMetadata,
    ) -> torch.Tensor:
        if layer_cache is None:
            raise ValueError(f"{self.name} attends over the paged KV pool: pass a KV cache")
        if not isinstance(meta, TritonPagedMetadata):
            raise TypeError(f"{self.name} needs metadata from its own prepare, got {type(meta).__name__}")
        write_kv(layer_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        if meta.decode_seqs:
            q_dec = q.index_select(0, meta.decode_token_indices)  # (num_decode, num_heads, head_dim)
            o_dec = paged_decode(
                q_dec, layer_cache[0], layer_cache[1], meta.block_tables, meta.seq_lens,
                num_splits=meta.num_splits,
            )  # (num_decode, num_heads, head_dim)
            out.index_copy_(0, meta.decode_token_indices, o_dec)
        self.attend_gathered(q, k, v, layer_cache, meta, out)
        return out

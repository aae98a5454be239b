"""The model runner: one scheduled step (a list of ScheduledSeq and their flat token ids) → greedy tokens.

It owns the model, the paged KV pool and the attention backend, turns a step into tensors (positions,
slot mapping, block tables: the backend's ``prepare``), runs the forward and takes the argmax of each
sequence's last logits. It can time a step: device time of the forward (CUDA events on a GPU, the wall
clock on CPU) and the cycle time of the whole call, host preparation and the device→host sync included.

On CUDA, decode-only steps may run as CUDA graphs (opt-in, ``cuda_graphs=True``, ``triton_paged`` only):
one graph per (batch bucket, context-pages bucket), captured lazily on first use, with static input
buffers; the batch is padded up to its bucket with rows that write to a scratch block outside the
scheduler's pool and are never read back.

The runner never schedules, allocates blocks or decides which request runs: block ids arrive in the
ScheduledSeq list, and swaps are copies of the blocks the caller names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from calibration.engine.attention import BACKENDS, ScheduledSeq, step_positions
from calibration.engine.attention.base import AttentionBackend
from calibration.engine.configs import ModelShape
from calibration.engine.kv_cache import KVCache
from calibration.engine.model import LlamaModel

DEFAULT_MAX_GRAPH_BATCH = 256
"""Largest decode batch captured as a CUDA graph; larger decode steps run eagerly."""


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Time of one executed step."""

    device_s: float
    """Forward plus sampling on the device: CUDA events around them on a GPU, the wall clock on CPU."""
    cycle_s: float
    """Wall clock of the whole call: host preparation, forward, sampling and the copy of tokens to host."""
    tokens: int
    """New tokens the step ran through the model."""


def graph_batch_buckets(max_batch: int) -> list[int]:
    """Batch sizes captured as graphs: 1, 2, 4, 8, then multiples of 8 up to ``max_batch`` (as vLLM)."""
    buckets = [b for b in (1, 2, 4) if b <= max_batch]
    buckets += list(range(8, max_batch + 1, 8))
    return buckets


def _bucket(n: int, buckets: Sequence[int]) -> int | None:
    for b in buckets:
        if b >= n:
            return b
    return None


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _DecodeGraph:
    """A captured decode step of ``batch`` rows over block tables ``pages`` wide, with its static buffers."""

    def __init__(self, runner: ModelRunner, batch: int, pages: int, pool: Any) -> None:
        from calibration.engine.attention.triton_paged import TritonPagedMetadata

        dev = runner.device
        bs = runner.block_size
        self.batch, self.pages = batch, pages
        self.pad_block = runner.pad_block
        self.input_ids = torch.zeros(batch, dtype=torch.int64, device=dev)  # (batch,)
        self.positions = torch.zeros(batch, dtype=torch.int64, device=dev)  # (batch,)
        self.slot_mapping = torch.full((batch,), self.pad_block * bs, dtype=torch.int64, device=dev)  # (batch,)
        self.block_tables = torch.full((batch, pages), self.pad_block, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(batch, dtype=torch.int32, device=dev)  # (batch,)
        rows = torch.arange(batch, dtype=torch.int64, device=dev)  # (batch,)
        backend = runner.backend
        self.meta = TritonPagedMetadata(
            backend=backend,
            num_new_tokens=[1] * batch,
            num_computed_tokens=[0] * batch,  # host copy unused by decode rows
            query_start=list(range(batch + 1)),
            last_token_indices=rows,
            block_size=bs,
            slot_mapping=self.slot_mapping,
            gather_seqs=[],
            context_slots=torch.empty(0, dtype=torch.int64, device=dev),
            context_start=[0],
            masks=[],
            decode_seqs=list(range(batch)),
            decode_token_indices=rows,
            block_tables=self.block_tables,
            seq_lens=self.seq_lens,
            num_splits=max(1, -(-pages // getattr(backend, "target_pages_per_split", 32))),
        )
        model, kv = runner.model, runner.kv_cache
        stream = torch.cuda.Stream(device=dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm up: Triton autotuning/compilation and allocator growth outside capture
                model(self.input_ids, self.positions, self.meta, kv).argmax(-1)
        torch.cuda.current_stream(dev).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool), torch.inference_mode():
            self.next_tokens = model(self.input_ids, self.positions, self.meta, kv).argmax(-1)  # (batch,)

    def load(self, seqs: Sequence[ScheduledSeq], input_ids: Sequence[int]) -> None:
        """Copy one decode step into the static buffers; rows past len(seqs) become scratch rows."""
        n, bs = len(seqs), self.meta.block_size
        ids = torch.zeros(self.batch, dtype=torch.int64)
        pos = torch.zeros(self.batch, dtype=torch.int64)
        slots = torch.full((self.batch,), self.pad_block * bs, dtype=torch.int64)
        lens = torch.ones(self.batch, dtype=torch.int32)
        tables = torch.full((self.batch, self.pages), self.pad_block, dtype=torch.int32)
        ids[:n] = torch.as_tensor(list(input_ids), dtype=torch.int64)
        for i, s in enumerate(seqs):
            p = s.num_computed_tokens
            num_pages = -(-s.seq_len // bs)
            pos[i] = p
            slots[i] = s.block_table[p // bs] * bs + p % bs
            lens[i] = s.seq_len
            tables[i, :num_pages] = torch.as_tensor(list(s.block_table[:num_pages]), dtype=torch.int32)
        for static, host in (
            (self.input_ids, ids), (self.positions, pos), (self.slot_mapping, slots),
            (self.seq_lens, lens), (self.block_tables, tables),
        ):
            static.copy_(host, non_blocking=True)


class ModelRunner:
    """A model, its paged KV pool and an attention backend on one device; runs steps it is handed."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        num_blocks: int,
        block_size: int = 16,
        backend: str = "sdpa_gather",
        seed: int = 0,
        num_layers: int | None = None,
        cuda_graphs: bool = False,
        max_graph_batch: int = DEFAULT_MAX_GRAPH_BATCH,
    ) -> None:
        """``num_blocks``: the scheduler's pool size (block ids in steps are < num_blocks). With
        ``cuda_graphs`` one extra scratch block is allocated for the padded rows of a graph."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; known: {', '.join(BACKENDS)}")
        if cuda_graphs and shape.moe is not None:
            raise ValueError(f"{shape.name}: an MoE model runs eagerly (its experts' token counts are read on the "
                             "host, which a CUDA graph cannot replay)")
        self.device = torch.device(device)
        if cuda_graphs and (self.device.type != "cuda" or backend != "triton_paged"):
            raise ValueError("cuda_graphs needs a CUDA device and the triton_paged backend")
        self.model = LlamaModel(shape, num_layers=num_layers, dtype=dtype, device=self.device, seed=seed)
        self.shape = self.model.shape
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pad_block = num_blocks
        """Scratch block for padded graph rows (exists only when cuda_graphs is on)."""
        self.kv_cache = KVCache(
            self.shape,
            num_blocks=num_blocks + (1 if cuda_graphs else 0),
            block_size=block_size,
            dtype=dtype,
            device=self.device,
        )
        self.backend: AttentionBackend[Any] = BACKENDS[backend](block_size=block_size, device=self.device)
        self.cuda_graphs = cuda_graphs
        self.graph_batch_sizes = graph_batch_buckets(max_graph_batch) if cuda_graphs else []
        self._graphs: dict[tuple[int, int], _DecodeGraph] = {}
        self._graph_pool: Any = torch.cuda.graph_pool_handle() if cuda_graphs else None

    # ----- steps -----------------------------------------------------------------------------------

    def execute(self, seqs: Sequence[ScheduledSeq], input_ids: Sequence[int]) -> list[int]:
        """Run one step; ``input_ids`` are every sequence's new tokens back to back, in ``seqs`` order.
        Returns the greedy next token of each sequence (meaningful where its last new token is its
        newest token; for a prompt chunk that does not finish the prompt the caller drops it)."""
        tokens, _timing = self._execute(seqs, input_ids, timed=False)
        return tokens

    def execute_timed(
        self, seqs: Sequence[ScheduledSeq], input_ids: Sequence[int]
    ) -> tuple[list[int], StepTiming]:
        """``execute`` plus the step's device and cycle time."""
        tokens, timing = self._execute(seqs, input_ids, timed=True)
        assert timing is not None
        return tokens, timing

    def _execute(
        self, seqs: Sequence[ScheduledSeq], input_ids: Sequence[int], *, timed: bool
    ) -> tuple[list[int], StepTiming | None]:
        start = time.perf_counter()
        num_tokens = sum(s.num_new_tokens for s in seqs)
        if len(input_ids) != num_tokens:
            raise ValueError(f"{len(input_ids)} input ids for a step of {num_tokens} new tokens")
        cuda = self.device.type == "cuda"
        with torch.inference_mode():
            run = self._prepare(seqs, input_ids)  # host work: tensors built and copied before timing
            if cuda and timed:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                next_tokens = run()
                end.record()
            else:
                device_start = time.perf_counter()
                next_tokens = run()
            tokens = [int(t) for t in next_tokens.tolist()]  # syncs with the device
        if not timed:
            return tokens, None
        device_s = begin.elapsed_time(end) / 1e3 if cuda else time.perf_counter() - device_start
        return tokens, StepTiming(device_s=device_s, cycle_s=time.perf_counter() - start, tokens=num_tokens)

    def _prepare(self, seqs: Sequence[ScheduledSeq], input_ids: Sequence[int]) -> Callable[[], torch.Tensor]:
        """Build the step's device inputs; returns the device work (forward + argmax → (num_seqs,) ids)."""
        graph = self._graph_for(seqs) if self.cuda_graphs else None
        if graph is not None:
            graph.load(seqs, input_ids)
            captured = graph

            def replay() -> torch.Tensor:
                captured.graph.replay()
                return captured.next_tokens[: len(seqs)]  # (num_seqs,)

            return replay
        ids = torch.as_tensor(list(input_ids), dtype=torch.int64).to(self.device, non_blocking=True)
        positions = step_positions(seqs, self.device)  # (num_tokens,)
        meta = self.backend.prepare(seqs)  # slot mapping, block tables, masks

        def forward() -> torch.Tensor:
            logits = self.model(ids, positions, meta, self.kv_cache)  # (num_seqs, vocab)
            return logits.argmax(-1)  # (num_seqs,)

        return forward

    def _graph_for(self, seqs: Sequence[ScheduledSeq]) -> _DecodeGraph | None:
        """The graph for a decode-only step (captured on first use), or None to run it eagerly."""
        if any(s.num_new_tokens != 1 for s in seqs):
            return None
        batch = _bucket(len(seqs), self.graph_batch_sizes)
        if batch is None:
            return None
        max_pages = max(-(-s.seq_len // self.block_size) for s in seqs)
        pages = _next_pow2(max_pages)
        key = (batch, pages)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = _DecodeGraph(self, batch, pages, self._graph_pool)
        return graph

    def release(self) -> None:
        """Give the device memory back (weights, KV pool, graphs) while references to the runner remain: a
        replay builds its next engine beside the last one's pool, which on a GPU takes most of its memory.
        The runner cannot run again."""
        import gc

        self._graphs.clear()
        del self.model, self.kv_cache, self.backend
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def capture_graphs_upto(self, max_batch: int, max_tokens: int) -> None:
        """Every decode graph a run of at most ``max_batch`` sequences of at most ``max_tokens`` tokens can use,
        captured now (as vLLM captures its graphs at start-up), so that no timed step pays for a capture: one
        per batch bucket up to the one holding ``max_batch`` and per power-of-two block-table width. Nothing
        without CUDA graphs."""
        if not self.cuda_graphs:
            return
        sizes = self.graph_batch_sizes
        covering = next((i for i, b in enumerate(sizes) if b >= max_batch), len(sizes) - 1)
        context = self.block_size
        while True:
            self.capture_graphs(sizes[: covering + 1], context)
            if context >= max_tokens:
                break
            context *= 2

    def capture_graphs(self, batch_sizes: Sequence[int], context_tokens: int) -> None:
        """Capture graphs ahead of time (before timing) for these batch sizes at this context length."""
        for b in batch_sizes:
            self._graph_for([ScheduledSeq(num_new_tokens=1, num_computed_tokens=context_tokens - 1)] * b)

    # ----- swaps -------------------------------------------------------------------------------------

    def swap_out(self, block_ids: Sequence[int]) -> torch.Tensor:
        """Copy these blocks to host memory; the handle is what ``swap_in`` takes back."""
        return self.kv_cache.swap_out(block_ids)

    def swap_in(self, handle: torch.Tensor, block_ids: Sequence[int]) -> None:
        """Copy a ``swap_out`` handle into these (possibly different) blocks."""
        self.kv_cache.swap_in(handle, block_ids)

"""The model runner: a step of ScheduledSeqs → greedy tokens equal to the dense oracle; timing; swaps;
CUDA-graph decode equal to eager (GPU only)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch

from calibration.engine.attention import ScheduledSeq
from calibration.engine.attention.dense import dense_last_logits
from calibration.engine.configs import get_model
from calibration.engine.runner import ModelRunner, StepTiming, graph_batch_buckets

TINY = get_model("tiny")


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(TINY.vocab_size) for _ in range(n)]


def test_mixed_step_matches_dense_oracle() -> None:
    """Prefill, chunk over a cached prefix, and decodes in one step: tokens equal the dense argmax."""
    runner = ModelRunner(TINY, num_blocks=32, block_size=4, seed=1)
    a, b = _tokens(10, 0), _tokens(7, 1)
    # Step 1: a's first 6 tokens, b's whole prompt.
    runner.execute(
        [ScheduledSeq(num_new_tokens=6, num_computed_tokens=0, block_table=[9, 2]),
         ScheduledSeq(num_new_tokens=7, num_computed_tokens=0, block_table=[30, 5])],
        a[:6] + b,
    )
    b.append(int(dense_last_logits(runner.model, [b])[0].argmax()))
    # Step 2: a's remaining chunk over its cached 6 tokens, b decodes; c shares a's first block.
    c = a[:4] + _tokens(3, 2)
    seqs = [
        ScheduledSeq(num_new_tokens=4, num_computed_tokens=6, block_table=[9, 2, 17]),
        ScheduledSeq(num_new_tokens=1, num_computed_tokens=7, block_table=[30, 5]),
        ScheduledSeq(num_new_tokens=3, num_computed_tokens=4, block_table=[9, 11]),
    ]
    tokens, timing = runner.execute_timed(seqs, a[6:] + b[7:] + c[4:])
    expected = dense_last_logits(runner.model, [a, b, c]).argmax(-1).tolist()
    assert tokens == expected
    assert isinstance(timing, StepTiming) and timing.tokens == 8
    assert timing.cycle_s >= timing.device_s > 0


def test_execute_rejects_mismatched_ids_and_bad_options() -> None:
    runner = ModelRunner(TINY, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="input ids"):
        runner.execute([ScheduledSeq(num_new_tokens=2, num_computed_tokens=0, block_table=[0])], [1])
    with pytest.raises(ValueError, match="unknown attention backend"):
        ModelRunner(TINY, num_blocks=8, backend="nope")
    with pytest.raises(ValueError, match="cuda_graphs"):
        ModelRunner(TINY, num_blocks=8, cuda_graphs=True)


def test_swap_out_and_in_move_kv_between_blocks() -> None:
    """Swapping a sequence's blocks out and into other blocks leaves its next token unchanged."""
    runner = ModelRunner(TINY, num_blocks=16, block_size=4, seed=2)
    prompt = _tokens(9, 3)
    first = runner.execute([ScheduledSeq(num_new_tokens=9, num_computed_tokens=0, block_table=[1, 2, 3])], prompt)
    handle = runner.swap_out([1, 2, 3])
    runner.kv_cache.pool.zero_()
    runner.swap_in(handle, [7, 12, 4])
    nxt = runner.execute([ScheduledSeq(num_new_tokens=1, num_computed_tokens=9, block_table=[7, 12, 4])], first)
    assert nxt == dense_last_logits(runner.model, [prompt + first]).argmax(-1).tolist()


def test_graph_buckets() -> None:
    assert graph_batch_buckets(4) == [1, 2, 4]
    assert graph_batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_matches_eager() -> None:
    """Padded graph replays (several buckets, growing contexts) give the eager tokens, step by step."""
    shape = get_model("small")
    # fp32: padding a batch to its bucket may change the GEMM kernel; bf16 rounding could flip an argmax.
    kwargs = dict(device="cuda", dtype=torch.float32, num_blocks=256, block_size=16, backend="triton_paged")
    eager = ModelRunner(shape, **kwargs)  # type: ignore[arg-type]
    graphed = ModelRunner(shape, cuda_graphs=True, max_graph_batch=16, **kwargs)  # type: ignore[arg-type]
    rng = random.Random(0)
    for batch in (1, 3, 5, 13):
        free = rng.sample(range(256), 8 * batch)
        tables = [free[8 * i : 8 * i + 8] for i in range(batch)]
        lens = [rng.randint(20, 100) for _ in range(batch)]
        prefill = [
            ScheduledSeq(num_new_tokens=n, num_computed_tokens=0, block_table=t)
            for n, t in zip(lens, tables, strict=True)
        ]
        ids = [rng.randrange(shape.vocab_size) for _ in range(sum(lens))]
        last = eager.execute(prefill, ids)
        assert graphed.execute(prefill, ids) == last
        for step in range(3):
            seqs = [
                ScheduledSeq(num_new_tokens=1, num_computed_tokens=n + step, block_table=t)
                for n, t in zip(lens, tables, strict=True)
            ]
            a, b = eager.execute(seqs, last), graphed.execute(seqs, last)
            assert a == b
            last = a
        assert graphed._graphs  # the decode steps really ran as graphs


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    """The device script rehearses on CPU with tiny shapes: it runs every step and writes its report."""
    from calibration.engine.gpu_check import main

    assert main(["--dry-run", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["failures"] == []
    assert [r["batch"] for r in report["decode"]] == [1, 2, 4]
    assert all(r["step_s"] > 0 and r["bytes_per_s"] > 0 for r in report["decode"])

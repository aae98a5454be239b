"""vLLM v1's core behaviour, re-expressed against ``simulator.core`` with vLLM's expected values.

The ``*_mirrors_vllm`` cases mirror vLLM's ``tests/v1/core/test_prefix_caching.py`` (vllm-project/vllm at
003df29) step by step: ``test_prefill``, ``test_prefill_plp`` (its duplicate-block part), ``test_decode``,
``test_evict``, ``test_hash_block_correct_reuse`` and ``test_computed_blocks_not_evicted``. The scenario and
the numbers are vLLM's, the code is ours. vLLM's pool reserves block 0 as its null block, so its block ids
are ours + 1; vLLM hashes token ids, the tests here name each distinct block content by an integer. The
other cases check the rules of ``vllm/v1/core/block_pool.py`` (free_blocks, BlockHashToBlockMap) and of
``Request.block_hashes`` (extended as outputs fill blocks) at vllm 6a1acac, as quoted in the docstrings of
the code they test.
"""

from __future__ import annotations

from simulator.core.block_pool import BlockPool
from simulator.core.kv_manager import KVManager
from simulator.core.request import Request, RequestSpec
from simulator.workload.config import WorkloadConfig
from simulator.workload.generate import generate

BS = 16


def _decode_to(kv: KVManager, request: Request, num_outputs: int) -> None:
    """Run the request's prompt in one step, then ``num_outputs`` decode steps, as the scheduler does:
    allocate the step's tokens, then count them computed and append the sampled token."""
    assert kv.allocate(request, request.num_prompt_tokens) is not None
    request.num_computed_tokens = request.num_prompt_tokens
    request.num_output_tokens = 1
    for _ in range(num_outputs - 1):
        assert kv.allocate(request, 1) is not None
        request.num_computed_tokens += 1
        request.num_output_tokens += 1


def test_recompute_after_preemption_hits_the_output_blocks() -> None:
    """vLLM's Request.block_hashes grow with outputs (every full block of prompt + output is hashed and
    cached as it fills): a 60-token prompt that produced 40 tokens, preempted by recompute, finds 6 full blocks
    (96 tokens) of its own cached, recomputing 4 — hashing only the prompt would find 3 and recompute 52."""
    hashes = tuple(range(1000, 1006))  # every full block of its 100 tokens, as the workload now gives them
    kv = KVManager(32, BS)
    request = Request(RequestSpec(0, 0.0, 60, 40, block_hashes=hashes))
    _decode_to(kv, request, 40)
    assert request.num_tokens == 100 and request.num_indexed_blocks == 6
    kv.free(request)  # preempted: RECOMPUTE frees the blocks, which keep their hashes
    request.num_computed_tokens = 0
    hit = kv.get_computed_blocks(request)
    assert len(hit) * BS == 96 and request.num_tokens - len(hit) * BS == 4
    prompt_only = Request(RequestSpec(1, 0.0, 60, 40, block_hashes=hashes[:3]))
    prompt_only.num_output_tokens = 40
    assert request.num_tokens - len(kv.get_computed_blocks(prompt_only)) * BS == 52


def test_synthetic_requests_hash_their_answers_too() -> None:
    """vLLM hashes every full block of prompt plus output; the workload gives each request the hashes of
    both, so the core can index output blocks as they fill (shared system prompts stay shared)."""
    config = WorkloadConfig.model_validate({
        "num_requests": 4, "arrival": {"process": "poisson", "rate_rps": 1.0},
        "prompt_tokens": {"dist": "fixed", "value": 60}, "output_tokens": {"dist": "fixed", "value": 40},
    })
    workload = generate(config, seed=0, block_size=BS)
    specs = workload.specs()
    assert all(len(s.block_hashes) == 100 // BS for s in specs)
    assert len({s.block_hashes[0] for s in specs}) == 4  # private streams: no false sharing


def _request(request_id: int, num_tokens: int, hashes: tuple[int, ...]) -> Request:
    return Request(RequestSpec(request_id, 0.0, num_tokens, 1, block_hashes=hashes))


def test_prefill_mirrors_vllm() -> None:
    kv = KVManager(10, BS)  # vLLM: 11 blocks, one of them the null block
    common = (11, 12, 13)  # three full blocks of common tokens
    req0 = _request(0, 55, common)  # 3 full blocks + 7 tokens
    assert kv.get_computed_blocks(req0) == []
    assert kv.allocate(req0, 55) is not None
    assert [b + 1 for b in req0.block_table] == [1, 2, 3, 4]
    assert [kv.pool.block_hash(b) for b in req0.block_table] == [11, 12, 13, None]
    req0.num_computed_tokens = 55

    req1 = _request(1, 53, common)  # cache hit in the common prefix while req0 still holds it
    hit = kv.get_computed_blocks(req1)
    assert [b + 1 for b in hit] == [1, 2, 3]
    assert kv.allocate(req1, 53 - 48, hit) is not None
    assert [b + 1 for b in req1.block_table[3:]] == [5]
    assert all(kv.pool.ref_count(b) == 2 for b in hit)
    assert kv.pool.num_free == 5
    req1.num_computed_tokens = 53

    kv.free(req0)
    kv.free(req1)
    assert kv.pool.num_free == 10
    # vLLM: partial blocks without hashes (5, 4) prepended, unallocated (6..10), common (3, 2, 1).
    assert [b + 1 for b in kv.pool.free_queue] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    req2 = _request(2, 54, common)  # a hit on blocks that are free now
    hit = kv.get_computed_blocks(req2)
    assert [b + 1 for b in hit] == [1, 2, 3]
    assert kv.allocate(req2, 54 - 48, hit) is not None
    assert [b + 1 for b in req2.block_table[3:]] == [5]  # the partial block 5 reused
    assert kv.pool.num_free == 6
    req2.num_computed_tokens = 54
    kv.free(req2)

    req3 = _request(3, 16 * 10, tuple(range(900, 910)))  # a miss that evicts everything
    assert kv.get_computed_blocks(req3) == []
    assert kv.allocate(req3, 160) is not None
    assert [b + 1 for b in req3.block_table] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]  # the eviction order
    assert kv.pool.num_free == 0


def test_prefill_plp_duplicates_mirror_vllm() -> None:
    """A request that may not take hits (vLLM: prompt logprobs) computes the common blocks again: its
    copies are hashed like the originals, with other ids, each referenced once."""
    kv = KVManager(10, BS)
    common = (11, 12, 13)
    req0, req1 = _request(0, 55, common), _request(1, 53, common)
    assert kv.allocate(req0, 55) is not None
    req0.num_computed_tokens = 55
    hit = kv.get_computed_blocks(req1)
    assert kv.allocate(req1, 5, hit) is not None
    req1.num_computed_tokens = 53
    kv.free(req0)
    kv.free(req1)
    assert [b + 1 for b in kv.pool.free_queue] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    req2 = _request(2, 54, common)
    assert kv.allocate(req2, 54) is not None  # no hit taken
    assert [b + 1 for b in req2.block_table] != [1, 2, 3, 4]
    assert [kv.pool.block_hash(b) for b in req2.block_table[:3]] == list(common)
    assert all(kv.pool.ref_count(b) == 1 for b in req2.block_table)


def test_decode_mirrors_vllm() -> None:
    kv = KVManager(10, BS)
    req0 = Request(RequestSpec(0, 0.0, 55, 30, block_hashes=(11, 12, 13, 14)))  # 14: the first output block
    assert kv.allocate(req0, 55) == 4
    req0.num_computed_tokens = 55
    req0.num_output_tokens = 4
    assert kv.allocate(req0, 4) == 0  # append slots without a new block
    assert kv.pool.block_hash(req0.block_table[-1]) is None
    req0.num_computed_tokens = 59
    req0.num_output_tokens += 19  # 9 tokens fill the last block, 10 start a new one
    assert kv.allocate(req0, 19) == 1
    assert kv.pool.block_hash(req0.block_table[-2]) == 14 and kv.pool.block_hash(req0.block_table[-1]) is None


def test_evict_mirrors_vllm() -> None:
    kv = KVManager(10, BS)
    req0 = _request(0, 5 * 16 + 7, (1, 2, 3, 4, 5))
    assert kv.allocate(req0, 87) == 6  # 5 full + 1 partial
    req0.num_computed_tokens = 87
    req1 = _request(1, 3 * 16, (6, 7, 8))
    assert kv.allocate(req1, 48) == 3
    req1.num_computed_tokens = 48
    assert kv.pool.num_free == 1
    kv.free(req0)
    # partial blocks (without hash) at the head, the others at the tail (LRU)
    assert [b + 1 for b in kv.pool.free_queue] == [6, 10, 5, 4, 3, 2, 1]
    kv.free(req1)
    assert [b + 1 for b in kv.pool.free_queue] == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    req2 = _request(2, 2 * 16 + 3, (1, 2))  # touch the first 2 blocks
    hit = kv.get_computed_blocks(req2)
    assert [b + 1 for b in hit] == [1, 2]
    assert kv.allocate(req2, 3, hit) == 1
    assert req2.block_table[-1] + 1 == 6
    assert kv.pool.num_free == 7


def test_hash_block_correct_reuse_mirrors_vllm() -> None:
    kv = KVManager(1, BS)
    req = _request(0, 16, (1,))
    assert kv.allocate(req, 16) == 1
    req.num_computed_tokens = 16
    kv.free(req)
    again = _request(1, 15, ())  # not full: the reused block must lose its old hash
    assert kv.allocate(again, 15) == 1
    assert kv.pool.block_hash(again.block_table[0]) is None and kv.pool.get_cached_block(1) is None


def test_computed_blocks_not_evicted_mirrors_vllm() -> None:
    kv = KVManager(2, BS)
    req0, req1 = _request(0, 16, (1,)), _request(1, 16, (2,))
    assert kv.allocate(req0, 16) == 1 and req0.block_table[0] + 1 == 1
    assert kv.allocate(req1, 16) == 1 and req1.block_table[0] + 1 == 2
    req0.num_computed_tokens = req1.num_computed_tokens = 16
    kv.free(req0)
    kv.free(req1)
    req2 = _request(2, 32, (1, 3))  # a hit on the first block: the other free block is evicted, not it
    hit = kv.get_computed_blocks(req2)
    assert [b + 1 for b in hit] == [1]
    assert kv.allocate(req2, 16, hit) == 1
    assert req2.block_table[-1] + 1 == 2


def test_free_queue_order_after_a_request_finishes() -> None:
    """block_pool.py free_blocks on one request's table (freed tail first): its full, hashed blocks are appended
    tail first (its last full block evicted first), its partial last block
    prepended (handed out before any never-used block)."""
    pool = BlockPool(10)
    table = pool.get_new_blocks(4)  # 3 full blocks and a partial one
    pool.cache_blocks(table[:3], (1, 2, 3))
    pool.free_blocks(reversed(table))
    assert pool.free_queue == [table[3], 4, 5, 6, 7, 8, 9, table[2], table[1], table[0]]


def test_duplicate_blocks_are_both_indexed() -> None:
    """BlockHashToBlockMap (block_pool.py): two requests that computed the same block each keep an indexed copy;
    the lookup serves the first; evicting it leaves the second."""
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_blocks(a, (42,))
    pool.cache_blocks(b, (42,))
    assert pool.get_cached_block(42) == a[0]
    pool.free_blocks(a + b)
    pool.get_new_blocks(3)  # 2 never-used blocks, then a's copy: evicted
    assert pool.get_cached_block(42) == b[0]

"""vLLM v1's core behaviour, re-expressed against ``simulator.core`` with vLLM's expected values.

The ``*_mirrors_vllm`` cases mirror vLLM's ``tests/v1/core/test_prefix_caching.py`` (vllm-project/vllm at
003df29) step by step, each named after the vLLM test it replays. The scenario and the numbers are vLLM's,
the code is ours. vLLM's pool reserves block 0 as its null block, so its block ids are ours + 1 and its
``num_blocks=N`` is our ``N - 1``; vLLM hashes token ids, the tests here name each distinct block content by
an integer. The other cases check the rules of ``vllm/v1/core/block_pool.py`` (free_blocks,
BlockHashToBlockMap) and of ``Request.block_hashes`` (extended as outputs fill blocks) at vllm 6a1acac, as
quoted in the docstrings of the code they test. The scheduler's tests (``test_scheduler.py``,
``test_async_scheduler.py``) are mirrored in ``test_vllm_parity_scheduler.py``.

What became of every test in ``test_prefix_caching.py`` @ 003df29:

============================================================  ==========================================
vLLM test                                                     here
============================================================  ==========================================
test_prefill[sha256, sha256_cbor]                             mirrored (the hash function is vLLM's
                                                              detail: ours are given integers)
test_prefill_plp                                              mirrored (its duplicate-copies part; the
                                                              prompt-logprobs flag only forbids the hit)
test_decode, test_evict, test_hash_block_correct_reuse,       mirrored
test_computed_blocks_not_evicted,
test_basic_prefix_caching_disabled, test_prefill_not_enough_
free_blocks_with_computed_blocks, test_maybe_evict_cached_
block, test_block_lookup_cache_multi_blocks_per_key
test_cache_blocks[sha256, sha256_cbor]                        mirrored through the KV manager, which
                                                              keeps the count of indexed blocks vLLM
                                                              passes in
test_block_lookup_cache_single_block_per_key                  mirrored in substance by the multi-block
                                                              case; its pop with a mismatched block id
                                                              is vLLM's map API, which our pool never
                                                              exposes (eviction always names the block)
test_prefill_hybrid_model, _hybrid_model_eagle, _hybrid_      n/a: hybrid models (sliding-window and
model_combinations, _hybrid_model_combinations_eagle,         Mamba KV groups, per-group block sizes,
_hybrid_model_mamba_align, test_hybrid_cache_mamba_align_     retention intervals); fleetsim models one
shared_prefix_detection, test_hybrid_model_mamba_align_with_  full-attention KV group
dynamic_draft_tokens, test_cache_blocks_multi_group,
test_different_block_size, test_hybrid_cache_blocks_swa_tail_
window_only, test_hybrid_cache_blocks_clamped_to_lcm, test_
hybrid_local_kv_retention_interval_aligns_in_manager, _
rejects_invalid, _survives_recycling, _latest_only_reuses_
replay_boundary, _mtp_reuses_latest_boundary, test_can_fit_
full_sequence_swa_cap_admits_long_prompt, _full_attention_
still_gates_oversized, test_swa_free_split_keeps_cached_tail_
ahead_of_scratch, test_pure_swa_retention_interval_caches_
sparse_tails, _latest_only, _dense_default_caches_all, test_
mamba_reachable_block_mask_sparsifies_retention, _pins_
shared_prefix, test_mamba_shared_prefix_survives_zero_
retention, _reuse_under_zero_retention, test_swa_reachable_
block_mask_pins_shared_prefix, test_swa_shared_prefix_reuse_
under_zero_retention
test_eagle_identical_prompt_hits_last_safe_block, test_       n/a: EAGLE / MTP speculative decoding
eagle_with_partial_blocks, _successor_token_controls_last_
block_hit, _blocks_are_published_only_after_draft_
materialization, _kv_events_publish_successor_hashes, _kv_
event_reconstructs_hash_with_coarser_cache_block, _hash_is_
published_when_successor_arrives, _hashing_supports_
resumable_requests, _hybrid_mamba_hits_partial_prompt_
boundary, _with_sliding_window, _swa_alignment_caches_extra_
block, _swa_boundary_caches_post_boundary_block, _grouped_
swa_siblings_use_same_cache_mask
test_mm_prefix_caching                                        n/a: multimodal hashes (its output-block
                                                              hash is test_decode's rule, mirrored)
test_cache_key_salting                                        n/a: cache salts are the workload's choice
                                                              of block names, not the core's
test_kv_cache_events, test_null_parent_block_hash, test_kv_   n/a: the KV event stream published to
cache_events_with_lora, test_block_stored_event_group_idx,    external routers (fleetsim's routers read
_multiple_groups, _out_of_bounds, test_block_removed_event_   the index directly), LoRA ids, groups
group_idx, test_emit_cached_block_events, _disabled, _zero_
cached, test_masked_block_does_not_emit_empty_stored_event
test_cache_hit_local_and_external, _three_groups, _three_     n/a: KV connectors (external hits) on
groups_preempt_and_reallocate, _two_groups_preempt_and_       hybrid groups
reallocate
test_reset_prefix_cache                                       n/a: an operator action, not a policy
test_prefix_cache_stats_disabled                              n/a: a logging switch
============================================================  ==========================================
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


def test_basic_prefix_caching_disabled_mirrors_vllm() -> None:
    """Block size 4, 4 blocks, caching off: nothing is found again, and a request needing a fifth block
    is refused."""
    kv = KVManager(4, 4, enable_caching=False)
    req1 = _request(1, 10, (1, 2))
    assert kv.allocate(req1, 10) == 3
    req1.num_computed_tokens = 10
    kv.free(req1)
    req2 = _request(2, 16, (1, 2, 3, 4))  # the same prefix: no hit without caching
    assert kv.get_computed_blocks(req2) == []
    assert kv.allocate(req2, 16) == 4
    req3 = _request(3, 4, (5,))
    assert kv.get_computed_blocks(req3) == []
    assert kv.allocate(req3, 4) is None


def test_cache_blocks_mirrors_vllm() -> None:
    """Block size 4, a 14-token request (3 full blocks): the first 2 are indexed from the start, then the
    third on its own, the first ones keeping their hashes."""
    kv = KVManager(4, 4)
    req = _request(0, 14, (1, 2, 3))
    assert kv.allocate(req, 8) == 2
    assert len(kv.pool.cached) == 2
    assert all(kv.pool.block_hash(b) is not None for b in req.block_table)
    req.num_computed_tokens = 8
    assert kv.allocate(req, 4) == 1
    assert len(kv.pool.cached) == 3
    assert kv.pool.block_hash(req.block_table[0]) == 1


def test_prefill_not_enough_free_blocks_with_computed_blocks_mirrors_vllm() -> None:
    """A request whose prefix hit cannot be allocated (its free hit blocks plus its new blocks exceed the
    free ones) leaves the hit blocks' reference counts as they were."""
    kv = KVManager(10, BS)
    common = (11, 12, 13)  # | Common-0 | Common-1 | Common-2 |
    req0 = _request(0, 48, common)
    assert kv.get_computed_blocks(req0) == []
    assert kv.allocate(req0, 48) is not None
    req0.num_computed_tokens = 48
    req1 = _request(1, 96, (*common, 21, 22, 23))  # | Common-0..2 | Req1-3 | Req1-4 | Req1-5 |
    hit = kv.get_computed_blocks(req1)
    assert hit == req0.block_table
    assert kv.allocate(req1, 48, hit) is not None
    req1.num_computed_tokens = 96
    part1 = list(req1.block_table)
    kv.free(req1)
    assert {kv.pool.ref_count(b) for b in part1[:3]} == {1}
    assert {kv.pool.ref_count(b) for b in part1[3:]} == {0}
    req2 = _request(2, 2 * BS, (31, 32))
    assert kv.get_computed_blocks(req2) == []
    assert kv.allocate(req2, 2 * BS) is not None
    assert kv.pool.num_free == 5
    req3 = _request(3, 144, (*common, 21, 22, 23, 41, 42, 43))  # req1's 6 blocks + 3 new: only 5 free
    hit = kv.get_computed_blocks(req3)
    assert hit == part1
    assert kv.allocate(req3, 48, hit) is None
    assert {kv.pool.ref_count(b) for b in part1[:3]} == {1}
    assert {kv.pool.ref_count(b) for b in part1[3:]} == {0}


def test_maybe_evict_cached_block_mirrors_vllm() -> None:
    """Four blocks indexed under h0, h1, h2, h0 (the last a duplicate copy of the first), evicted in the
    order 1, 0, 2, 3: evicting block 0 leaves h0 served by block 3; evicting block 3 empties the index."""
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    h0, h1, h2 = 10, 20, 30
    pool.cache_blocks(blocks, (h0, h1, h2, h0))
    assert (pool.get_cached_block(h0), pool.get_cached_block(h1), pool.get_cached_block(h2)) == (0, 1, 2)
    pool.free_blocks([1, 0, 2, 3])  # the free queue's order is the eviction order
    assert pool.get_new_blocks(1) == [1]
    assert (pool.get_cached_block(h0), pool.get_cached_block(h1), pool.get_cached_block(h2)) == (0, None, 2)
    assert pool.get_new_blocks(1) == [0]
    assert (pool.get_cached_block(h0), pool.get_cached_block(h2)) == (3, 2)
    assert pool.get_new_blocks(1) == [2]
    assert (pool.get_cached_block(h0), pool.get_cached_block(h2)) == (3, None)
    assert pool.get_new_blocks(1) == [3]
    assert pool.get_cached_block(h0) is None and not pool.cached


def test_block_lookup_cache_multi_blocks_per_key_mirrors_vllm() -> None:
    """BlockHashToBlockMap with two copies of each of two keys: a lookup answers with the copy inserted
    first; removing it exposes the other; removing both leaves nothing."""
    pool = BlockPool(4)
    b00, b01, b10, b11 = pool.get_new_blocks(4)
    key0, key1 = 100, 101
    pool.cache_blocks([b00, b01, b10, b11], (key0, key0, key1, key1))
    pool.free_blocks([b00, b01, b10, b11])
    assert pool.get_cached_block(key0) == b00
    pool.get_new_blocks(1)
    assert pool.get_cached_block(key0) == b01
    pool.get_new_blocks(1)
    assert pool.get_cached_block(key0) is None
    assert pool.get_cached_block(key1) == b10
    pool.get_new_blocks(1)
    assert pool.get_cached_block(key1) == b11
    pool.get_new_blocks(1)
    assert pool.get_cached_block(key1) is None

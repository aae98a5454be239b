"""Block pool and KV manager: exact cases and hypothesis state machines over their invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator.core.block_pool import BlockPool, Pin
from simulator.core.kv_manager import KVManager
from simulator.core.request import Request, RequestSpec


def test_without_caching_the_last_freed_block_is_reused_first() -> None:
    pool = BlockPool(6, enable_caching=False)
    a = pool.get_new_blocks(3)  # ids 0 1 2
    b = pool.get_new_blocks(2)  # ids 3 4
    pool.free_blocks(reversed(b))
    pool.free_blocks(reversed(a))
    assert pool.free_queue == [0, 1, 2, 3, 4, 5]  # a's head was freed last
    assert pool.get_new_blocks(4) == [0, 1, 2, 3]
    assert pool.get_new_blocks(2) == [4, 5]  # the stack empties, then a never-used block
    assert pool.num_free == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5), st.integers(1, 4)), max_size=30), st.integers(4, 24))
def test_append_new_blocks_hands_out_what_get_new_blocks_would(ops: list[tuple[bool, int, int]],
                                                               num_blocks: int) -> None:
    """Popping blocks onto tables one by one (a decode run's path) gives each table the very blocks, in
    the same order, that one get_new_blocks call would have returned, and leaves the pool the same."""
    by_list, by_tables = BlockPool(num_blocks, enable_caching=False), BlockPool(num_blocks, enable_caching=False)
    held: list[list[int]] = []
    for free, n, num_tables in ops:
        if free and held:
            blocks = held.pop(n % len(held))
            by_list.free_blocks(blocks[::-1])
            by_tables.free_blocks(blocks[::-1])
            continue
        if num_tables > by_list.num_free:
            with pytest.raises(ValueError):
                by_tables.append_new_blocks([[] for _ in range(num_tables)])
            continue
        expected = by_list.get_new_blocks(num_tables)
        tables: list[list[int]] = [[7] for _ in range(num_tables)]
        by_tables.append_new_blocks(tables)
        assert tables == [[7, block] for block in expected]
        held.append(expected)
        assert by_tables.free_queue == by_list.free_queue and by_tables.num_free == by_list.num_free


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6)), max_size=40), st.integers(4, 24), st.booleans())
def test_get_new_blocks_into_a_table_appends_what_a_new_list_would_hold(ops: list[tuple[int, int]], num_blocks: int,
                                                                      caching: bool) -> None:
    """``get_new_blocks(n, into=table)`` appends to the table the very blocks, in order, that
    ``get_new_blocks(n)`` returns, and leaves the pool the same: through never-used blocks, the freed
    queue (hashed blocks evicted, stale entries passed over), runs of marked blocks and, without caching,
    the stack; a refusal leaves the table untouched."""
    by_list, by_table = BlockPool(num_blocks, enable_caching=caching), BlockPool(num_blocks, enable_caching=caching)
    held: list[list[int]] = []
    next_hash = 1 << 40
    for kind, n in ops:
        if kind == 0 and held:  # free a table: hashed (queued, evictable) or plain (to the front)
            blocks = held.pop(n % len(held))
            if caching and n % 2:
                hashes = list(range(next_hash, next_hash + len(blocks)))
                next_hash += len(blocks)
                for pool in (by_list, by_table):
                    pool.cache_blocks(blocks, hashes)
            if caching and n % 3 == 0 and len(blocks) > 1:  # finished: its blocks as one marked run
                for pool in (by_list, by_table):
                    pool.cache_range(blocks, tuple(range(len(blocks))), 0, len(blocks), 0)
                    pool.free_marked_table(list(blocks), 0, len(blocks))
            else:
                for pool in (by_list, by_table):
                    pool.free_blocks(blocks[::-1])
            continue
        if kind == 1 and caching and by_list.cached:  # a prefix hit takes a queued block back
            hit = next(iter(by_list.cached.values()))
            if by_list.ref_count(hit) == 0:
                for pool in (by_list, by_table):
                    pool.touch([hit])
                held.append([hit])
            continue
        table = [7, 8]
        if n > by_list.num_free:
            with pytest.raises(ValueError):
                by_list.get_new_blocks(n)
            with pytest.raises(ValueError):
                by_table.get_new_blocks(n, table)
            assert table == [7, 8]
            continue
        expected = by_list.get_new_blocks(n)
        assert by_table.get_new_blocks(n, table) is table
        assert table == [7, 8, *expected]
        held.append(expected)
        assert (by_table.free_queue, by_table.num_free, by_table.num_evictions, by_table.cached) == (
            by_list.free_queue, by_list.num_free, by_list.num_evictions, by_list.cached)


def test_append_new_block_refuses_when_nothing_is_free() -> None:
    """A decode token's block (``append_new_block``, with caching) is refused, the table untouched, when every
    block is referenced: none at the front, none never used, and the freed queue holding only a stale entry
    (a prefix hit took its block back); the next block freed is handed out."""
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.cache_blocks([a], [1 << 40])
    pool.free_blocks([a])
    pool.touch([a])
    table = [b]
    with pytest.raises(ValueError, match="0 free"):
        pool.append_new_block(table)
    assert table == [b] and pool.num_free == 0
    pool.free_blocks([a])  # cached: to the freed queue, behind its stale entry
    pool.append_new_block(table)
    assert table == [b, a] and pool.num_evictions == 1 and pool.num_free == 0


def test_free_order_is_lru_and_reverse_within_a_request() -> None:
    pool = BlockPool(6, unhashed_first=False)  # the older order: every freed block to the tail
    a = pool.get_new_blocks(3)  # ids 0 1 2
    b = pool.get_new_blocks(2)  # ids 3 4
    assert pool.free_queue == [5]
    pool.free_blocks(reversed(b))
    pool.free_blocks(reversed(a))
    # Freed later = evicted later; within a request the tail block goes first.
    assert pool.free_queue == [5, 4, 3, 2, 1, 0]


def test_unhashed_blocks_are_handed_out_first() -> None:
    """vLLM v1 (vllm/v1/core/block_pool.py at 6a1acac, free_blocks): freed blocks without a hash are
    prepended, with a hash appended; the mirror of tests/v1/core/test_prefix_caching.py's free-queue order
    checks. A request of 3 blocks, the first two full and cached, the last partial."""
    pool = BlockPool(6)
    a = pool.get_new_blocks(3)  # 0 1 2
    pool.cache_blocks(a[:2], (100, 101))
    b = pool.get_new_blocks(2)  # 3 4, never filled
    pool.free_blocks(reversed(a))  # 2 (no hash) to the front; 1, 0 to the tail
    assert pool.free_queue == [2, 5, 1, 0]
    pool.free_blocks(reversed(b))  # 4, 3 to the front, before 2
    assert pool.free_queue == [4, 3, 2, 5, 1, 0]
    assert pool.get_new_blocks(4) == [4, 3, 2, 5]  # the cached prefix survives four allocations
    assert pool.get_cached_block(100) == 0 and pool.num_evictions == 0


def test_duplicate_copies_stay_findable_after_one_is_evicted() -> None:
    """Two requests computed the same block concurrently: both copies are indexed (vLLM's
    BlockHashToBlockMap); a lookup answers with the older, and evicting it leaves the younger."""
    pool = BlockPool(4)
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_blocks(first, (7,))
    pool.cache_blocks(second, (7,))
    assert pool.get_cached_block(7) == first[0] and pool.block_hash(second[0]) == 7
    pool.free_blocks(first)
    pool.free_blocks(second)
    assert pool.free_queue == [2, 3, first[0], second[0]]  # both hashed: both to the tail
    pool.get_new_blocks(3)  # evicts the older copy
    assert pool.get_cached_block(7) == second[0] and pool.num_evictions == 1
    pool.get_new_blocks(1)
    assert pool.get_cached_block(7) is None and pool.num_evictions == 2


def test_cached_block_is_evicted_only_when_popped() -> None:
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_blocks((blk,), (111,))
    pool.free_blocks([blk])
    assert pool.get_cached_block(111) == blk  # freed but still findable
    pool.get_new_blocks(1)  # pops block 1, the older free block
    assert pool.get_cached_block(111) == blk
    pool.get_new_blocks(1)  # pops block 0: now the hash is gone
    assert pool.get_cached_block(111) is None
    assert pool.num_evictions == 1


def test_hits_on_free_blocks_leave_no_unbounded_trail() -> None:
    """A prefix hit takes a free block out of the middle of the queue by leaving a stale entry behind;
    a block hit and freed again and again (a shared system prompt on a quiet replica) must not grow the
    queue without bound, and the eviction order must stay exact."""
    pool = BlockPool(8, unhashed_first=False)
    shared = pool.get_new_blocks(2)
    for i, block in enumerate(shared):
        pool.cache_blocks((block,), (100 + i,))
    other = pool.get_new_blocks(1)
    pool.free_blocks(reversed(shared))
    pool.free_blocks(other)
    for _ in range(5000):
        hits = [pool.get_cached_block(100), pool.get_cached_block(101)]
        pool.touch(hits)
        pool.free_blocks(reversed(hits))
    assert len(pool._freed) < 2 * pool.num_free + 2048
    assert pool.free_queue == [3, 4, 5, 6, 7, other[0], shared[1], shared[0]]
    assert pool.get_new_blocks(8)[-3:] == [other[0], shared[1], shared[0]]
    assert pool.num_evictions == 2 and not pool.cached


def test_a_long_churn_keeps_the_lru_order_and_a_bounded_queue() -> None:
    """Thousands of frees and pops (past the point where the queue drops the entries it has read): the
    hand-out order stays least recently freed first, and the queue holds only the free blocks' entries."""
    pool = BlockPool(8, unhashed_first=False)
    expected = list(range(8))
    for round_ in range(1500):
        taken = pool.get_new_blocks(5)
        assert taken == expected[:5]
        expected = expected[5:]
        order = taken[::-1] if round_ % 2 else taken[1:] + taken[:1]
        pool.free_blocks(order)
        expected += order
        assert pool.free_queue == expected
    assert len(pool._freed) - pool._freed_head == pool.num_free
    assert len(pool._freed) < 3000  # the entries read were dropped along the way


def test_prefix_hit_capped_below_the_last_token() -> None:
    kv = KVManager(8, 4)
    first = Request(RequestSpec(0, 0.0, 8, 1, block_hashes=(10, 11)))
    assert kv.allocate(first, 8) is not None
    kv.free(first)
    same = Request(RequestSpec(1, 0.0, 8, 1, block_hashes=(10, 11)))
    # 8 tokens, both blocks cached, but the last token must be recomputed: one block hits.
    assert [kv.pool.block_hash(b) for b in kv.get_computed_blocks(same)] == [10]
    longer = Request(RequestSpec(2, 0.0, 9, 1, block_hashes=(10, 11)))
    assert [kv.pool.block_hash(b) for b in kv.get_computed_blocks(longer)] == [10, 11]


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / free / cache / touch sequences against a plain model of refs and queue order."""

    @initialize(num_blocks=st.integers(1, 12), caching=st.booleans(), unhashed_first=st.booleans(),
                share=st.booleans())
    def setup(self, num_blocks: int, caching: bool, unhashed_first: bool, share: bool) -> None:
        # caching off has its own free path
        self.pool = BlockPool(num_blocks, enable_caching=caching, unhashed_first=unhashed_first)
        # A fleet-wide index (``share_index``) it mirrors its own into, holding another pool's hashes too: the
        # pool's bit must follow its index exactly and leave the other's alone.
        self.shared: dict[int, int] | None = {h: OTHER_POOL for h in range(1, 6)} if share else None
        if self.shared is not None:
            self.pool.share_index(self.shared, THIS_POOL)
        self.holders: list[list[int]] = []  # each holder: block ids it references, in order
        self.model_queue = list(range(num_blocks))
        self.model_cache: dict[int, int] = {}
        self.model_copies: dict[int, list[int]] = {}  # hash -> further copies, oldest first
        self.next_hash = 1

    def _hashed(self, bid: int) -> bool:
        return bid in self.model_cache.values() or any(bid in c for c in self.model_copies.values())

    def _evict(self, bid: int) -> None:
        for h, b in list(self.model_cache.items()):
            if b == bid:
                copies = self.model_copies.pop(h, [])
                if copies:
                    self.model_cache[h] = copies.pop(0)
                    if copies:
                        self.model_copies[h] = copies
                else:
                    del self.model_cache[h]
        for h, copies in list(self.model_copies.items()):
            if bid in copies:
                copies.remove(bid)
                if not copies:
                    del self.model_copies[h]

    def _queue_freed(self, order: list[int]) -> None:
        """Blocks reaching zero references, in the order freed, into the model queue."""
        front: list[int] = []
        for bid in order:
            if self._refs(bid) == 0:
                if not self.pool.enable_caching:
                    self.model_queue.insert(0, bid)  # a stack: freed last, handed out first
                elif self.pool.unhashed_first and not self._hashed(bid):
                    front.append(bid)  # vLLM: nothing can hit it, so it goes first
                else:
                    self.model_queue.append(bid)  # LRU: freed last, evicted last
        self.model_queue = front + self.model_queue

    @rule(n=st.integers(1, 6))
    def allocate(self, n: int) -> None:
        if n > self.pool.num_free:
            return
        blocks = self.pool.get_new_blocks(n)
        expected, self.model_queue = self.model_queue[:n], self.model_queue[n:]
        assert blocks == expected  # popped from the head (LRU with caching, the stack's top without)
        for bid in expected:
            self._evict(bid)
        self.holders.append(expected)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        self.pool.free_blocks(reversed(holder))
        self._queue_freed(holder[::-1])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def free_table(self, data: st.DataObject) -> None:
        """A request's table freed whole (tail first): without caching the pool keeps the list itself."""
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        order = holder[::-1]
        self.pool.free_table(holder)
        self._queue_freed(order)

    @precondition(lambda self: not self.pool.enable_caching)
    @rule(num_tables=st.integers(1, 3))
    def append(self, num_tables: int) -> None:
        """Blocks popped one per table (a decode run's path) come off the stack in hand-out order."""
        if num_tables > self.pool.num_free:
            return
        tables: list[list[int]] = [[] for _ in range(num_tables)]
        self.pool.append_new_blocks(tables)
        expected, self.model_queue = self.model_queue[:num_tables], self.model_queue[num_tables:]
        assert tables == [[bid] for bid in expected]
        self.holders.extend(tables)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self.holders))
        bid = data.draw(st.sampled_from(holder))
        if self.pool.block_hash(bid) is None and self.pool.enable_caching:
            self.pool.cache_blocks((bid,), (self.next_hash,))
            self.model_cache[self.next_hash] = bid
            self.next_hash += 1

    @precondition(lambda self: self.holders and self.model_cache)
    @rule(data=st.data())
    def cache_copy(self, data: st.DataObject) -> None:
        """A block computed again by another request: indexed as a further copy of a held hash."""
        holder = data.draw(st.sampled_from(self.holders))
        bid = data.draw(st.sampled_from(holder))
        block_hash = data.draw(st.sampled_from(sorted(self.model_cache)))
        if self.pool.block_hash(bid) is None and self.pool.enable_caching:
            self.pool.cache_blocks((bid,), (block_hash,))
            self.model_copies.setdefault(block_hash, []).append(bid)

    @precondition(lambda self: self.model_cache)
    @rule(data=st.data())
    def hit(self, data: st.DataObject) -> None:
        block_hash = data.draw(st.sampled_from(sorted(self.model_cache)))
        block = self.pool.get_cached_block(block_hash)
        assert block is not None and block == self.model_cache[block_hash]
        if self.pool.ref_count(block) == 0:
            self.model_queue.remove(block)
        self.pool.touch([block])
        self.holders.append([block])

    def _refs(self, bid: int) -> int:
        return sum(h.count(bid) for h in self.holders)

    @invariant()
    def conserved_and_consistent(self) -> None:
        queue_ids = self.pool.free_queue
        assert queue_ids == self.model_queue  # hand-out order as documented
        assert len(queue_ids) == self.pool.num_free
        referenced = [b for b in range(self.pool.num_blocks) if self.pool.ref_count(b) > 0]
        assert len(referenced) + self.pool.num_free == self.pool.num_blocks
        assert not set(referenced) & set(queue_ids)
        for block in range(self.pool.num_blocks):
            assert self.pool.ref_count(block) == self._refs(block)
        assert self.pool.cached == self.model_cache
        assert self.pool._copies == self.model_copies
        assert all(self.pool.block_hash(b) == h for h, b in self.pool.cached.items())
        if self.shared is not None:
            assert {h for h, mask in self.shared.items() if mask & THIS_POOL} == set(self.pool.cached)
            assert {h for h, mask in self.shared.items() if mask & OTHER_POOL} == set(range(1, 6))
            assert all(mask & ~(THIS_POOL | OTHER_POOL) == 0 and mask for mask in self.shared.values())


THIS_POOL = 1 << 2
OTHER_POOL = 1 << 7
"""Bits of the pool under test and of another pool in a shared index."""


def test_a_pool_shares_its_index_once_with_a_power_of_two() -> None:
    pool = BlockPool(4)
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_blocks(first, (11,))  # cached before sharing: mirrored as the pool joins
    shared: dict[int, int] = {11: 1, 12: 1}
    with pytest.raises(ValueError, match="power of two"):
        pool.share_index(shared, 3)
    pool.share_index(shared, 2)
    assert shared == {11: 3, 12: 1} and pool.shares_index
    with pytest.raises(ValueError, match="already"):
        pool.share_index({}, 4)
    pool.cache_blocks(second, (12,))
    assert shared == {11: 3, 12: 3}
    pool.free_blocks(first + second)
    pool.get_new_blocks(4)  # evicts both: the other pool's bits stay
    assert shared == {11: 1, 12: 1}


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class KVManagerMachine(RuleBasedStateMachine):
    """Requests with shared hash prefixes grow, hit the cache and finish; tables and refs stay exact."""

    BS = 4

    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans())
    def setup(self, num_blocks: int, caching: bool) -> None:
        self.kv = KVManager(num_blocks, self.BS, enable_caching=caching)
        self.live: dict[int, Request] = {}
        self.next_id = 0

    @rule(prefix=st.integers(0, 3), prompt=st.integers(1, 20), family=st.integers(0, 2))
    def admit(self, prefix: int, prompt: int, family: int) -> None:
        # Hash chains from three families; requests of a family share their leading blocks.
        num_full = prompt // self.BS
        hashes = tuple(family * 1000 + i for i in range(num_full))
        req = Request(RequestSpec(self.next_id, 0.0, prompt, 4, block_hashes=hashes))
        self.next_id += 1
        hits = self.kv.get_computed_blocks(req)
        # Exactly the blocks holding the longest cached prefix, in order.
        expected = 0
        while expected < min(len(hashes), (prompt - 1) // self.BS) and hashes[expected] in self.kv.pool.cached:
            expected += 1
        assert [self.kv.pool.block_hash(b) for b in hits] == list(hashes[:expected])
        chunk = min(prompt - len(hits) * self.BS, 1 + prefix * 3)
        fresh = self.kv.allocate(req, chunk, hits)
        if fresh is None:
            assert req.block_table == [] and req.request_id not in self.kv.req_blocks
            return
        assert len(req.block_table) == len(hits) + fresh == -(-(len(hits) * self.BS + chunk) // self.BS)
        assert self.kv.req_blocks[req.request_id] is req.block_table
        req.num_computed_tokens = len(hits) * self.BS + chunk
        self.live[req.request_id] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 6))
    def grow(self, data: st.DataObject, n: int) -> None:
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if req.num_computed_tokens >= req.num_tokens:
            req.num_output_tokens += 1  # produce a token so there is one more to compute
        n = min(n, req.num_tokens - req.num_computed_tokens)
        held = len(req.block_table)
        fresh = self.kv.allocate(req, n)
        if fresh is not None:
            assert len(req.block_table) == held + fresh
            req.num_computed_tokens += n

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.kv.free(req)

    @invariant()
    def tables_match_refs(self) -> None:
        pool = self.kv.pool
        counts = [0] * pool.num_blocks
        for req in self.live.values():
            table = self.kv.req_blocks.get(req.request_id, [])
            assert len(table) * self.BS >= req.num_computed_tokens
            for block in table:
                counts[block] += 1
        assert [pool.ref_count(b) for b in range(pool.num_blocks)] == counts
        assert pool.num_free + sum(1 for c in counts if c) == pool.num_blocks
        stats = self.kv.stats(list(self.live.values()))
        assert stats.num_used_blocks == sum(1 for c in counts if c)
        for block_hash, block in pool.cached.items():
            assert pool.block_hash(block) == block_hash


TestKVManager = KVManagerMachine.TestCase
TestKVManager.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


def test_holds_prefix_answers_as_a_fresh_walk_would() -> None:
    """``holds_prefix`` (a lookup answered from an earlier one, made when the pool's count of copies was
    ``made``) is True only where a walk of the index would find exactly those blocks: each still holds its
    hash, the walk stops after them (a miss or the cap), and no copy of a hash was made since (a block
    holding a hash again could then be a younger copy, not the one the index answers with)."""
    h0, h1, h2 = 1 << 40, (1 << 40) + 1, (1 << 40) + 2
    pool = BlockPool(6)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_blocks([a], [h0])
    made = pool.copies_made
    assert pool.holds_prefix([a], (h0, h1), 2, made)
    assert pool.holds_prefix([a], (h0, h1), 1, made)  # the cap ends the walk
    assert not pool.holds_prefix([a], (h0, h1), 0, made)  # more blocks than the cap allows
    pool.cache_blocks([b], [h1])
    assert not pool.holds_prefix([a], (h0, h1), 2, made)  # the walk would go on to b now
    assert pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    twin = int(str(h1))  # equal, but another int object: walk again (the check is by identity)
    assert twin is not h1 and not pool.holds_prefix([a, b], (h0, twin, h2), 3, made)
    pool.cache_blocks([c], [h0])  # a second copy of h0 (a's stays the answer, but a copy was made)
    assert pool.copies_made == made + 1 and not pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    made = pool.copies_made  # walked again: a and b
    assert pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    pool.free_blocks([a, b])  # a, then b, to the queue's tail: still cached, a still the answer for h0
    assert pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    pool.get_new_blocks(3)  # the three never-used ones
    taken = pool.get_new_blocks(1)  # a, freed first, is evicted: c's copy answers for h0 now
    assert taken == [a] and pool.cached[h0] == c
    assert not pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    pool.cache_blocks([a], [h0])  # a holds h0 again, a copy of c's: not the answer
    assert pool.cached[h0] == c and pool.copies_made == made + 1
    assert not pool.holds_prefix([a, b], (h0, h1, h2), 3, made)
    made = pool.copies_made
    assert pool.holds_prefix([c, b], (h0, h1, h2), 3, made)  # what a walk finds now


def _walk(pool: BlockPool, hashes: tuple[int, ...], cap: int) -> list[int]:
    """What a lookup of ``hashes`` capped at ``cap`` finds: a walk of the index to its first miss."""
    found: list[int] = []
    while len(found) < cap and hashes[len(found)] in pool.cached:
        found.append(pool.cached[hashes[len(found)]])
    return found


def test_holds_pin_answers_as_a_fresh_walk_would() -> None:
    """``holds_pin`` (a held pin's blocks answered without reading them) is True only where a walk of the
    index would find exactly the pin's blocks, and never for a pin nobody holds (its blocks may have been
    evicted): the lookup's first hashes are the pin's (by value), and the walk stops after them."""
    h0, h1, h2, other = 1 << 40, (1 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3
    pool = BlockPool(8)
    a, b, c, d = pool.get_new_blocks(4)
    pool.cache_blocks([a, b], [h0, h1])
    pool.free_blocks([a, b])
    pin = Pin([a, b], (h0, h1))
    assert not pool.holds_pin(pin, (h0, h1, h2), 3)  # nobody holds it: only a walk can tell
    pool.hold(pin)
    cases = [((h0, h1, h2), 3), ((h0, h1, h2), 2), ((h0, h1), 1), ((h0, other, h2), 3), ((other, h1, h2), 3),
             ((h0, int(str(h1)), h2), 3)]  # the last: equal to h1, another int object (compared by value)
    for hashes, cap in cases:
        assert pool.holds_pin(pin, hashes, cap) == (_walk(pool, hashes, cap) == [a, b]), (hashes, cap)
    assert pool.holds_pin(pin, (h0, int(str(h1)), h2), 3)
    pool.cache_blocks([c], [h0])  # a younger copy of h0: a, held, stays the answer
    assert pool.holds_pin(pin, (h0, h1, h2), 3) and _walk(pool, (h0, h1, h2), 3) == [a, b]
    pool.cache_blocks([d], [h2])  # the walk goes on past the pin now
    assert not pool.holds_pin(pin, (h0, h1, h2), 3) and _walk(pool, (h0, h1, h2), 3) == [a, b, d]
    assert pool.holds_pin(pin, (h0, h1, other), 3)
    pool.free_table([a, b], pin)  # its last holder gone (a table of the pin's blocks alone)
    assert pin.holders == 0 and not pool.holds_pin(pin, (h0, h1, other), 3)


def test_held_prefix_answers_the_part_still_held() -> None:
    """A lookup answered from an earlier one whose deepest blocks were evicted since (an overloaded
    replica's blocked queue head): the blocks before the first one evicted, when a walk would stop there;
    -1 (walk again) when another block answers for the hash there now."""
    h0, h1, h2, other = 1 << 40, (1 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3
    pool = BlockPool(4)
    a, b, c, d = pool.get_new_blocks(4)
    pool.cache_blocks([a, b, c], [h0, h1, h2])
    made = pool.copies_made
    assert pool.held_prefix([a, b, c], (h0, h1, h2), 3, made) == 3
    assert pool.held_prefix([a, b, c], (h0, h1, h2), 2, made) == 2  # the cap ends the walk
    pool.free_blocks([c, b, a])  # c to the queue's head: evicted first
    assert pool.get_new_blocks(1) == [c]
    assert pool.held_prefix([a, b, c], (h0, h1, h2), 3, made) == 2  # a walk finds a, b, then misses h2
    assert not pool.holds_prefix([a, b, c], (h0, h1, h2), 3, made)
    assert pool.held_prefix([a, b, c], (h0, h1, h2), 3, made + 1) == -1  # a copy made since: walk
    pool.cache_blocks([c], [other])
    pool.cache_blocks([d], [h2])  # h2 answered by d now: a walk finds a, b, d
    assert pool.held_prefix([a, b, c], (h0, h1, h2), 3, made) == -1
    assert pool.held_prefix([a, b, d], (h0, h1, h2), 3, made) == 3

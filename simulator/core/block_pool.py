"""Block pool: pre-allocated KV blocks with reference counts, an LRU free queue and a prefix-cache index.

Invariants (tested by a hypothesis state machine):
- every block is either referenced (``ref_cnt > 0``) or in the free queue, never both;
- free blocks + referenced blocks = all blocks;
- a block keeps its hash after it is freed and stays findable until it is popped for reuse: eviction
  happens only then (lazy eviction), so the free queue's order IS the eviction order;
- the queue is ordered by the time blocks were freed (LRU at the head); a request frees its blocks in
  reverse order, so its tail blocks (longest prefixes, least likely to be shared) are evicted first.

The pool knows nothing about requests or scheduling. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class Block:
    """One physical KV block. ``prev``/``next`` link it into the free queue while it is free."""

    __slots__ = ("block_hash", "block_id", "next", "prev", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks: O(1) pop from the head, append, and removal from
    the middle (a prefix hit on a free cached block takes it out of the queue)."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)  # sentinels keep the link updates branch-free
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> Block:
        block = self._head.next
        if block is self._tail or block is None:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def append(self, block: Block) -> None:
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self._len += 1

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev, block.next
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self._len -= 1

    def __iter__(self) -> Iterator[Block]:
        block = self._head.next
        while block is not None and block is not self._tail:
            yield block
            block = block.next


class BlockPool:
    """All KV blocks of one replica, the free queue, and the hash -> block index of the prefix cache.

    The free order starts as all blocks in id order; a freed block goes to the tail. Blocks never handed
    out therefore always sit at the head, in id order, and are created lazily the first time they are
    handed out: a pool of a million blocks costs nothing until it is used (a 64-replica fleet would
    otherwise build tens of millions of objects before its first step).

    One block per hash: if two requests compute the same block concurrently, the second copy is simply
    not indexed (vLLM keeps duplicates; a duplicate can never be found by a later lookup that the first
    copy would not also answer, so only eviction timing differs).
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._created: list[Block] = []
        self._next_fresh = 0
        """Blocks with this id or above were never handed out: the head of the free order."""
        self._freed = FreeBlockQueue(())
        """Blocks handed out and freed since, in the order they were freed (after the fresh ones)."""
        self.cached: dict[int, Block] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now, including cached blocks nobody references (evictable)."""
        return self.num_blocks - self._next_fresh + len(self._freed)

    @property
    def num_used(self) -> int:
        return self._next_fresh - len(self._freed)

    @property
    def blocks(self) -> list[Block]:
        """Every block, by id (creates the ones never used: for tests and invariant checks)."""
        self._block(self.num_blocks - 1)
        return self._created

    @property
    def free_queue(self) -> Iterable[Block]:
        """The free blocks in eviction order (head first)."""
        return [self._block(i) for i in range(self._next_fresh, self.num_blocks)] + list(self._freed)

    def _block(self, block_id: int) -> Block:
        created = self._created
        if len(created) <= block_id:
            created.extend(Block(i) for i in range(len(created), block_id + 1))
        return created[block_id]

    def get_cached_block(self, block_hash: int) -> Block | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[Block]:
        """Pop blocks from the head of the free order (least recently freed first), evicting their hashes."""
        if num_blocks > self.num_free:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free} free")
        out: list[Block] = []
        num_fresh = min(num_blocks, self.num_blocks - self._next_fresh)
        if num_fresh:
            start = self._next_fresh
            self._block(start + num_fresh - 1)
            out = self._created[start : start + num_fresh]
            for block in out:
                block.ref_cnt = 1
            self._next_fresh += num_fresh
        for _ in range(num_blocks - num_fresh):
            block = self._freed.popleft()
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-hit blocks; a free one leaves the queue (it is no longer evictable)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._freed.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block, in the order given; blocks reaching zero go to the tail."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._freed.append(block)
            elif block.ref_cnt < 0:
                raise AssertionError(f"{block} freed more often than referenced")

    def cache_block(self, block: Block, block_hash: int) -> None:
        """Index a full, computed block under its chained hash (first copy wins)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash not in self.cached:
            self.cached[block_hash] = block
            block.block_hash = block_hash

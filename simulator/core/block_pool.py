"""Block pool: KV blocks (plain integer ids) with reference counts, an LRU free queue and a prefix-cache index.

With the prefix cache on, the invariants below hold; with it off, no block is ever shared or found again,
so eviction order means nothing and the pool is a stack instead: the most recently freed block is handed
out first, then never-used ones (a fleet of replicas then touches only the blocks it needs at its peak,
not every block of every pool, which keeps a large simulation's working set in the CPU's caches). The
stack is kept as the freed tables themselves (a request frees its table tail first, so the table read
front to back is the stack read from the top): freeing a table, or handing out a whole one again, moves
no block id.

Invariants (tested by a hypothesis state machine):
- every block is either referenced (``ref_count > 0``) or in the free queue, never both;
- free blocks + referenced blocks = all blocks;
- a block keeps its hash after it is freed and stays findable until it is popped for reuse: eviction
  happens only then (lazy eviction), so the free queue's order IS the eviction order;
- blocks with a hash are queued by the time they were freed (LRU at the head); a request frees its blocks
  in reverse order, so its tail blocks (longest prefixes, least likely to be shared) are evicted first;
- blocks freed without a hash (a partly filled last block, or any block of a request that never filled
  one) go to the *front* of the queue, in the order freed, before even the never-used ones: nothing can
  hit them, so handing them out first lets cached prefixes live longer. This is vLLM v1's order
  (``BlockPool.free_blocks`` at vllm-project/vllm 6a1acac, vllm/v1/core/block_pool.py:730-742:
  ``prepend_n(blocks_without_hash)``, ``append_n(blocks_with_hash)``); ``unhashed_first=False`` keeps
  the older all-to-the-tail order for engines that still use it;
- several blocks may hold the same hash (two requests computed the same block concurrently): all are
  indexed, a lookup answers with the oldest copy still cached, and evicting one copy leaves the others
  findable (vLLM's ``BlockHashToBlockMap``, same commit, vllm/v1/core/block_pool.py).
- a block whose hash is private (no other request carries it, and its own request will not look it up:
  ``cache_range``'s ``private_from``) is *marked* instead of indexed: it counts as cached, is queued and
  evicted exactly as an indexed block, but costs no index entry and no per-block work. Nothing can look it
  up, so a lookup answers as it would with the block indexed; ``index_private`` indexes marked blocks when
  their request could look them up after all (it leaves the device unfinished). A request that finishes
  frees its marked blocks as one *run* (``free_marked_table``): a list queued as one entry, in the order
  ``free_blocks`` would have queued them, handed out from by slices. Nothing can hit, free or touch a block
  in a run, so it keeps the reference count of 1 it had (``ref_count`` and ``ref_cnt`` answer 0 for it)
  and its entry is always live. A fleet whose requests share nothing (a chat workload) otherwise spends
  most of its time on per-block bookkeeping for blocks nobody will ever find again.

- blocks that many requests take as one prefix (a system prompt's) may be held through a ``Pin``: while
  it has holders it references each of its blocks once, and holding it costs a count, not a reference and a
  release per block. It takes its references as its first holder would and drops them, last block first,
  as its last holder would; ``ref_count`` and ``ref_cnt`` report each holder's reference.

Blocks are ints, not objects: a replica hands out and frees tens of blocks per request, and a simulated
fleet does so millions of times. Per-block state lives in flat lists indexed by block id, which grow only
as blocks are first handed out (a pool of a million blocks costs nothing until it is used); the counts among
it are native arrays of machine ints when compiled (``_counts``). Without the
prefix cache nothing is ever shared, so a block is referenced exactly when it has been handed out and is
not in the free stack: the pool then keeps no per-block state at all, and handing out or freeing n blocks
is one C-level list operation rather than n Python steps.

The pool knows nothing about requests or scheduling. Standard library only (compiled, mypyc's runtime too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    from librt.vecs import extend, vec  # compiled, native arrays of machine ints (mypyc's runtime, with mypy)
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

_COMPACT_SLACK: Final = 1024
"""Stale free-queue entries tolerated beyond the live ones before the queue is rebuilt without them."""

NOT_PRIVATE: Final = 1 << 62
"""A ``private_from`` past any table: no block is private (``cache_range``, ``Request.private_from``)."""

_INTS: Final[list[Any]] = []
"""The ints 0, 1, 2, ... as objects shared by everything in the process that stores many of them: block ids
(a pool hands these out rather than making its own: an id past 256 is an object of its own; a fleet of many
replicas then holds one set of id objects rather than one per replica: less memory, fewer of them to keep in
the CPU's caches), a decode run's event keys (``decode_run``: stored, sorted and dropped per run)."""


def shared_ints(stop: int) -> list[Any]:
    """The shared int objects, at least ``stop`` of them (``_INTS``)."""
    ints = _INTS
    if len(ints) < stop:
        ints += range(len(ints), max(stop, 2 * len(ints), 1024))
    return ints


_COMPILED: Final = type(shared_ints).__name__ == "builtin_function_or_method"
"""Whether this module runs compiled (``fleetsim build-native``): its functions are then native ones."""


def _counts() -> vec[i64]:
    """An empty list of per-block counts (``BlockPool._ref``, ``_entries``). Compiled, a ``vec[i64]``: machine
    ints side by side, read and written with no object in between (a list holds a pointer to an int object
    per item, unboxed on each read and boxed on each write). Interpreted, a plain list, which reads and writes
    faster there; both are indexed alike, and only ``_grown_counts`` and ``_copied_counts`` tell them apart."""
    if _COMPILED:
        return vec[i64]()
    return cast("vec[i64]", [])


def _grown_counts(counts: vec[i64], num: int) -> vec[i64]:
    """``counts`` with ``num`` zeros after it: a vec grows into a new one (use the result), a list in place.
    The vec's zeros come from a buffer of 64-bit ints, which it copies whole; from a list of zeros it would
    unbox and append them one by one (13 % of a 10 k-request run of 16 replicas whose pools fill up)."""
    if _COMPILED:
        return extend(counts, memoryview(bytes(8 * num)).cast("q"))
    cast("list[int]", counts).extend([0] * num)
    return counts


def _copied_counts(counts: vec[i64]) -> vec[i64]:
    """A copy of ``counts`` in the same form (for readers that count down on it: ``_take_live``)."""
    if _COMPILED:
        return vec[i64](counts)
    return cast("vec[i64]", list(cast("list[int]", counts)))


class Pin:
    """Blocks that many requests take as one prefix (a system prompt's, found by one walk of the index), held
    as one: while anyone holds the pin, it holds one reference on each of its blocks, and a request holding
    it costs a count, not a reference and a release per block (``BlockPool.hold``). What the pool reports and
    does is the same as if each holder referenced each block: the pin takes its references as its first
    holder would (``touch``) and drops them, last block first, as its last holder would (``free_table``)."""

    __slots__ = ("blocks", "hashes", "holders")

    def __init__(self, blocks: list[int], hashes: tuple[int, ...]) -> None:
        self.blocks = blocks
        """The blocks, in table order: every holder's table starts with them."""
        self.hashes = hashes
        """The hash each block holds (the walk that found them looked these up)."""
        self.holders = 0


class BlockPool:
    """All KV blocks of one replica, the free queue, and the hash -> block index of the prefix cache.

    The free order starts as all blocks in id order; a freed block goes to the tail. Blocks never handed
    out therefore always sit at the head, in id order (ids ``_num_handed`` and above).

    The freed part of the queue is a list of block ids read from a moving head. A prefix hit on a free
    cached block takes it out of the middle of the queue; rather than search the list, the entry is left in
    place and skipped when it reaches the head (lazy deletion): an entry is live when its block is free and
    it is the block's most recent entry (``_entries`` counts each block's entries in the queue).

    Blocks freed without a hash wait on ``_front``, a stack whose top is the head of the whole order.
    Duplicate copies of a hash (beyond the one ``cached`` answers with) wait in ``_copies``, oldest first.
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = True, unhashed_first: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref = _counts()
        """With caching: the reference count of each block (index = block id), as far as blocks have been
        handed out and a margin past them (``_grow``; later ids are all 0). Without caching it stays empty
        (``ref_cnt`` derives the counts)."""
        self._num_handed = 0
        """Blocks handed out at least once: ids below this have left the never-used head of the order."""
        self._entries = _counts()
        """Entries of each block in ``_freed`` (lazy deletion); kept only with caching, the one user of
        removal from the middle."""
        self._freed: list[Any] = []
        """With caching: blocks handed out and freed since, in the order they were freed (after the
        never-used ones), from ``_freed_head`` on: a list read from a moving head (entries before it are
        gone; the list is cut when they are most of it) is a queue whose operations are native, compiled.
        An entry is a block id, or a run of marked blocks (a list of ids, ``free_marked_table``)."""
        self._freed_head = 0
        self._chunks: list[list[int]] = []
        """Without caching, the free stack (blocks handed out and freed since, the most recently freed first
        out): a list of chunks, the top one last, each in the order its blocks are handed out; the first
        ``_offset`` blocks of the top chunk are already out. A chunk is usually a freed request's table."""
        self._offset = 0
        self._offsets: list[int] = []
        """The ``_offset`` of each chunk below the top, bottom first (kept when a chunk is covered)."""
        self._num_freed = 0
        """Free blocks in ``_freed`` (with caching: its live entries and the blocks of its runs) or in
        ``_chunks`` (without)."""
        self._hash_of: list[Any] = []
        """With caching: the hash each block handed out so far is indexed under, None for none (index = block
        id, as ``_ref``): a list, not a dict, so that every free and every eviction reads it by index."""
        self.cached: dict[int, int] = {}
        """Hash -> block id: the prefix-cache index (the oldest copy still cached). Marked blocks are not in
        it (``num_cached`` counts them too)."""
        self._num_marked = 0
        """Blocks marked private: cached, but not in the index (``cache_range``)."""
        self._num_in_runs = 0
        """Free blocks in runs (``free_marked_table``)."""
        self._copies: dict[int, list[int]] = {}
        """Hash -> further blocks holding it, oldest first (vLLM indexes duplicate copies too)."""
        self.copies_made = 0
        """Copies made so far (a hash cached by a block while another holds it): a lookup answered from an
        earlier one checks that none was made since (``holds_prefix``)."""
        self.unhashed_first = unhashed_first
        self._front: list[int] = []
        """With caching and ``unhashed_first``: blocks freed without a hash, the next one handed out last
        (a stack). Nothing can hit them, so they never leave it but by being handed out."""
        self.num_evictions = 0
        self.on_evict: Callable[[int, int], None] | None = None
        """Called with a hash and the block that held it as its last cached copy is evicted, before the
        block is reused (KV tiers take the hash: ``core.kv_tiers``; a runner may copy the block's bytes)."""
        self.on_cache: Callable[[int], None] | None = None
        """Called with a hash as it is first indexed (a store written as blocks are computed takes it)."""
        self._shared: dict[Any, Any] | None = None
        self._shared_bit = 0
        """A fleet-wide index this pool's ``cached`` keys are mirrored into (``share_index``), and this pool's
        bit in its masks; None for none."""
        self._held_pins: set[Pin] = set()
        """Pins with holders: each holds one reference on each of its blocks (``ref_cnt`` reports their
        holders instead)."""

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now, including cached blocks nobody references (evictable)."""
        return self.num_blocks - self._num_handed + self._num_freed + len(self._front)

    @property
    def num_cached(self) -> int:
        """Distinct hashes cached: those in the index and the marked blocks' (referenced or evictable)."""
        return len(self.cached) + self._num_marked

    @property
    def num_used(self) -> int:
        return self._num_handed - self._num_freed - len(self._front)

    @property
    def ref_cnt(self) -> list[int]:
        """Reference count of each block handed out so far (index = block id; later ids are all 0), as a new
        list, in O(blocks): for checks, not hot paths."""
        if self.enable_caching:
            counts = list(self._ref[:self._num_handed])
            for pin in self._held_pins:
                for block_id in pin.blocks:
                    counts[block_id] += pin.holders - 1
            if not self._num_in_runs:
                return counts
            for block_id in self._run_blocks():
                counts[block_id] = 0
            return counts
        free = set(self._stack_order())
        return [0 if block_id in free else 1 for block_id in range(self._num_handed)]

    def ref_count(self, block_id: int) -> int:
        if block_id >= self._num_handed:
            return 0
        if self.enable_caching:
            if self._num_in_runs and block_id in self._run_blocks():
                return 0
            return self._ref[block_id] + sum(pin.holders - 1 for pin in self._held_pins if block_id in pin.blocks)
        return 0 if block_id in self._stack_order() else 1

    def num_unreferenced(self, blocks: Sequence[int], stop: int = -1, start: int = 0) -> int:
        """How many of these blocks (``blocks[start:stop]``; to the end when ``stop`` is negative) nobody
        references (prefix hits on free cached blocks: never blocks in a run, which nothing can find)."""
        ref = self._ref
        ids: list[Any] = blocks if isinstance(blocks, list) else list(blocks)  # compiled: an indexed loop
        num: i64 = 0
        i: i64 = start
        count: i64 = len(ids)
        if 0 <= stop < count:
            count = stop
        while i < count:
            block_id: int = ids[i]
            if ref[block_id] == 0:
                num += 1
            i += 1
        return num

    def _run_blocks(self) -> set[int]:
        """The free blocks in runs (for checks)."""
        return {block_id for entry in self._take_live(_copied_counts(self._entries), flatten=False)
                if isinstance(entry, list) for block_id in entry}

    def block_hash(self, block_id: int) -> int | None:
        """The hash a block is indexed under (it keeps it while free, until it is popped for reuse); None
        for none, and for a marked block (its request holds the hash)."""
        hash_of = self._hash_of
        return hash_of[block_id] if block_id < len(hash_of) else None

    @property
    def num_marked(self) -> int:
        """Blocks marked private (cached, not indexed), referenced or free."""
        return self._num_marked

    @property
    def free_queue(self) -> list[int]:
        """The free blocks in the order they will be handed out: eviction order with caching (head first);
        without it, most recently freed first, then the never-used ones."""
        never_used = list(range(self._num_handed, self.num_blocks))
        if not self.enable_caching:
            return self._stack_order() + never_used
        return self._front[::-1] + never_used + self._live_freed()

    def _stack_order(self) -> list[int]:
        """Without caching: the freed blocks on the stack, in the order they will be handed out."""
        order: list[int] = []
        offsets = [*self._offsets, self._offset]
        for position in range(len(self._chunks) - 1, -1, -1):
            order += self._chunks[position][offsets[position]:]
        return order

    def _live_freed(self) -> list[int]:
        """The live entries of the freed queue, in order: a free block's most recent entry."""
        return self._take_live(_copied_counts(self._entries), flatten=True)  # on a copy: a reader changes nothing

    def _take_live(self, counts: vec[i64], *, flatten: bool) -> list[Any]:
        """The live entries of the freed queue, in order, in one pass with no side table: each entry read
        takes one off its block's entry count in ``counts`` (``_entries`` or a copy), so the entry that
        brings the count to zero is the block's most recent, live if the block is free. Every queued
        block's count ends at zero. A run is live whole (what is left of it at the head): its blocks
        (``flatten``) or the run as one list."""
        live: list[Any] = []
        ref = self._ref
        freed: list[Any] = self._freed
        i: i64 = self._freed_head
        count: i64 = len(freed)
        while i < count:
            held = freed[i]
            if isinstance(held, list):
                # A run is what is left of it (it is cut as it is handed out, last block first).
                if flatten:
                    live.extend(held[::-1])
                elif held:  # a run a later request took over (``take_run``) is empty: no entry any more
                    live.append(held)
            else:
                block_id: int = held
                left = counts[block_id] - 1
                counts[block_id] = left
                if left == 0 and ref[block_id] == 0:
                    live.append(held)
            i += 1
        return live

    def holds_prefix(self, blocks: list[int], block_hashes: tuple[int, ...], max_blocks: int,
                     copies_made: int) -> bool:
        """Whether a prefix lookup of ``block_hashes`` capped at ``max_blocks`` (``KVManager
        .get_computed_blocks``) would answer ``blocks`` now, given that one did when ``copies_made`` (this
        pool's count then) was the count of copies made (``held_prefix``)."""
        return self.held_prefix(blocks, block_hashes, max_blocks, copies_made) == len(blocks)

    def held_prefix(self, blocks: list[int], block_hashes: tuple[int, ...], max_blocks: int,
                    copies_made: int) -> int:
        """How many leading ``blocks`` a prefix lookup of ``block_hashes`` capped at ``max_blocks`` would
        answer now, given that one answered ``blocks`` when ``copies_made`` (this pool's count then) was the
        count of copies made; -1 when only a walk can tell. The answer is the blocks before the first that
        no longer holds the very hash object at its position (or the cap), when no copy of any hash was made
        since and the walk would stop there (the next hash, if the cap allows one, is not cached). Each of
        them is still the one the index answers with: an answer changes only as its block is evicted, and
        the block could hold the hash again only by caching it anew, as a copy of the new answer if there is
        one (which counts as a copy made). A blocked queue head whose deepest hits were evicted (an
        overloaded replica: its decodes pop the free queue's head, where they sit) is answered with the rest,
        not walked again."""
        if self.copies_made != copies_made:
            return -1
        hash_of: list[Any] = self._hash_of
        ids: list[Any] = blocks
        hashes: tuple[Any, ...] = block_hashes
        num: i64 = len(blocks)
        if num > max_blocks:
            num = max_blocks
        i: i64 = 0
        while i < num:
            block_id: int = ids[i]
            if hash_of[block_id] is not hashes[i]:
                break
            i += 1
        if i == max_blocks or hashes[i] not in self.cached:
            return i
        return -1

    def holds_pin(self, pin: Pin, block_hashes: tuple[int, ...], max_blocks: int) -> bool:
        """``holds_prefix(pin.blocks, ...)`` for a pin with holders that a walk found since it last had
        none, in O(1) Python steps rather than one per block. A held block is never evicted, so each of them
        is still the index's answer for the hash it held when found (a copy made since is younger, and a
        lookup answers with the oldest): a walk of ``block_hashes`` capped at ``max_blocks`` answers the
        pin's blocks when its first hashes are theirs (compared in one C-level step) and it stops after
        them."""
        num = len(pin.blocks)
        if not pin.holders or num > max_blocks or block_hashes[:num] != pin.hashes:
            return False
        return num == max_blocks or block_hashes[num] not in self.cached

    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int, into: list[int] | None = None) -> list[int]:
        """Pop blocks from the head of the free order (least recently freed first), evicting their hashes;
        without caching, the most recently freed first. ``into``: appended to that list (a request's table)
        and it is returned, rather than a new list the caller would copy over."""
        # ``num_free`` spelled out, here and in ``append_new_blocks`` (a property: interpreted, a call).
        if num_blocks > self.num_blocks - self._num_handed + self._num_freed + len(self._front):
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free} free")
        start = self._num_handed
        if not self.enable_caching:
            if into is None:
                return self._pop_stack(num_blocks) if num_blocks > 0 else []
            if num_blocks > 0:
                into += self._pop_stack(num_blocks)
            return into
        ref = self._ref
        out: list[int] = [] if into is None else into
        front = self._front
        if front:
            take = len(front)  # min() spelled out here and below (a builtin call each, interpreted)
            if num_blocks < take:
                take = num_blocks
            for _ in range(take):
                block_id = front.pop()
                ref[block_id] = 1
                out.append(block_id)
            num_blocks -= take
            if not num_blocks:
                return out
        num_fresh = self.num_blocks - start
        if num_blocks < num_fresh:
            num_fresh = num_blocks
        remaining = num_blocks - num_fresh
        if num_fresh == 1:  # the usual case (a decode token starting a block): no temporary lists
            self._num_handed = start + 1
            out.append(shared_ints(start + 1)[start])
            if start >= len(ref):
                self._grow(start + 1)
                ref = self._ref  # (grown: compiled, a new vec)
            ref[start] = 1
        elif num_fresh:
            self._num_handed = start + num_fresh
            out += shared_ints(start + num_fresh)[start:start + num_fresh]
            self._grow(start + num_fresh)
            ref = self._ref
            for block_id in range(start, start + num_fresh):
                ref[block_id] = 1
        if remaining:
            self._take_freed(out, remaining)
        return out

    def _grow(self, stop: int) -> None:
        """The per-block lists (``_ref``, ``_entries``, ``_hash_of``) long enough for ids below ``stop``,
        padded as a never-used block is (no reference, no entry, no hash): grown by at least doubling (up to
        the pool's size), not one append per block handed out, which grew them by an eighth at a time, each
        time copied whole."""
        size = len(self._ref)
        if stop <= size:
            return
        num = min(self.num_blocks, max(stop, 2 * size, 1024)) - size
        self._ref = _grown_counts(self._ref, num)
        self._entries = _grown_counts(self._entries, num)
        self._hash_of.extend([None] * num)

    def append_new_block(self, table: list[int]) -> None:
        """``table.append(get_new_blocks(1)[0])`` without the one-block list: a decode token starting a
        block (with the prefix cache: the least recently freed block, its hash evicted)."""
        if not self.enable_caching:
            self.append_new_blocks([table])
            return
        front = self._front
        if front:
            block_id = front.pop()
            self._ref[block_id] = 1
            table.append(block_id)
            return
        start = self._num_handed
        if start < self.num_blocks:
            self._num_handed = start + 1
            ints = _INTS  # (the shared ints usually reach it: no call)
            table.append(ints[start] if start < len(ints) else shared_ints(start + 1)[start])
            ref = self._ref
            if start >= len(ref):
                self._grow(start + 1)
                ref = self._ref  # (grown: compiled, a new vec)
            ref[start] = 1
            return
        if self._num_freed < 1:  # (no block at the front, none never used: the freed ones are all there is)
            raise ValueError("asked for 1 block, 0 free")
        freed: list[Any] = self._freed
        head: i64 = self._freed_head
        held = freed[head]
        if isinstance(held, list) and held:
            # A run of marked blocks at the head (the usual case once a pool of finished requests' tables
            # has cycled): its next block, exactly as ``_take_freed`` hands one out, without its set-up.
            run: list[Any] = held
            table.append(run.pop())
            if not run:
                head += 1
                if head > _COMPACT_SLACK and 2 * head > len(freed):
                    del freed[:head]
                    head = 0
                self._freed_head = head  # (the head did not move otherwise: nothing to compact)
            self._num_freed -= 1
            self.num_evictions += 1
            self._num_marked -= 1
            self._num_in_runs -= 1
            return
        self._take_freed(table, 1)

    def _take_freed(self, out: list[int], remaining: int) -> None:
        """Append ``remaining`` blocks from the freed queue's head to ``out`` (live entries and runs, in
        order), evicting their hashes."""
        self._num_freed -= remaining
        # Ids and hashes held as objects (compiled: no unboxing and re-boxing on their way from list to list
        # and into the index); the int indexes the per-block lists.
        freed: list[Any] = self._freed
        given: list[Any] = out
        head: i64 = self._freed_head
        ref = self._ref
        entries = self._entries
        hash_of: list[Any] = self._hash_of
        cached: dict[Any, Any] = self.cached
        # With nobody told of evictions, the eviction of a hash held by one block only (the usual case) is
        # one delete from the index, here; a hash with copies goes through ``_uncache``.
        copies: dict[Any, Any] = self._copies
        plain = self.on_evict is None
        evictions: i64 = 0
        from_runs: i64 = 0
        while remaining:
            held = freed[head]
            if isinstance(held, list):
                # A run of marked blocks: handed out last block first, each one evicted (nothing to unindex),
                # its reference count still 1; what is handed out is cut off the run (C-level moves of the
                # ids, no reference counted anew but the ones ``given`` takes).
                run: list[Any] = held
                size: i64 = len(run)
                num_taken: i64 = size
                if num_taken > remaining:
                    num_taken = remaining
                else:
                    head += 1
                if num_taken == size:
                    run.reverse()
                    given += run  # the whole run
                    run.clear()  # all out: its references dropped now, while its ids are in the CPU's caches
                else:
                    part = run[size - num_taken:]
                    del run[size - num_taken:]
                    part.reverse()
                    given += part
                from_runs += num_taken
                remaining -= num_taken
                continue
            index: int = held
            head += 1
            left = entries[index] - 1
            entries[index] = left
            if left or ref[index]:
                continue  # a stale entry: the block was taken by a hit, or freed again later
            block_hash = hash_of[index]
            if block_hash is not None:
                hash_of[index] = None
                if plain and (not copies or block_hash not in copies):
                    del cached[block_hash]
                    evictions += 1
                    if self._shared is not None:
                        self._unshare(block_hash)
                else:
                    self._uncache(block_hash, held)
            ref[index] = 1
            given.append(held)
            remaining -= 1
        self.num_evictions += evictions + from_runs
        self._num_marked -= from_runs
        self._num_in_runs -= from_runs
        if head > _COMPACT_SLACK and 2 * head > len(freed):
            del freed[:head]  # the entries read are most of the list: drop them (amortised O(1) each)
            head = 0
        self._freed_head = head

    @property
    def shares_index(self) -> bool:
        """Whether this pool mirrors its index into a shared one (``share_index``)."""
        return self._shared is not None

    def share_index(self, index: dict[Any, Any], bit: int) -> None:
        """Mirror this pool's index into ``index``, shared by several pools: hash -> the bitwise or of the
        ``bit`` of every pool whose ``cached`` holds it, kept so as hashes are indexed and evicted from now on
        (those cached now are added here). One walk of the shared index then answers every pool's
        ``cached`` walk at once (``fleet.prefix_index``). Marked blocks stay out of it, as out of ``cached``."""
        if bit <= 0 or bit & (bit - 1):
            raise ValueError(f"a pool's bit must be a power of two, got {bit}")
        if self._shared is not None:
            raise ValueError("this pool already mirrors its index into a shared one")
        self._shared = index
        self._shared_bit = bit
        for block_hash in self.cached:
            self._share(block_hash)

    def _share(self, block_hash: Any) -> None:
        """``block_hash`` entered ``cached``: set this pool's bit in the shared index."""
        shared = self._shared
        assert shared is not None
        shared[block_hash] = shared.get(block_hash, 0) | self._shared_bit

    def _unshare(self, block_hash: Any) -> None:
        """``block_hash`` left ``cached``: clear this pool's bit in the shared index (the hash leaves it with
        the last pool's bit)."""
        shared = self._shared
        assert shared is not None
        mask = shared[block_hash] & ~self._shared_bit
        if mask:
            shared[block_hash] = mask
        else:
            del shared[block_hash]

    def _uncache(self, block_hash: Any, block_id: Any) -> None:
        """Evict one copy of ``block_hash``: the next oldest copy, if any, answers lookups from now on. (Hash
        and id typed as objects: compiled, as ints they would be unboxed here and boxed anew for the index
        and for ``on_evict``.)"""
        self.num_evictions += 1
        copies = self._copies.get(block_hash)
        if self.cached[block_hash] == block_id:
            if copies:
                self.cached[block_hash] = copies.pop(0)
                if not copies:
                    del self._copies[block_hash]
            else:
                del self.cached[block_hash]
                if self._shared is not None:
                    self._unshare(block_hash)
                if self.on_evict is not None:
                    self.on_evict(block_hash, block_id)
        elif copies is not None:
            copies.remove(block_id)
            if not copies:
                del self._copies[block_hash]

    def _pop_stack(self, num_blocks: int) -> list[int]:
        """Without caching: ``num_blocks`` (>= 1, at most the free ones) from the top of the stack, then
        never-used ids, as a new list the caller owns: a top chunk taken whole is handed over itself, part
        of one is a slice."""
        chunks = self._chunks
        if chunks:
            top = chunks[-1]
            offset = self._offset
            available = len(top) - offset
            if num_blocks <= available:
                self._num_freed -= num_blocks
                if num_blocks < available:
                    self._offset = offset + num_blocks
                    return top[offset:offset + num_blocks]
                self._drop_top()
                return top[offset:] if offset else top
        out: list[int] = []
        remaining = num_blocks
        while remaining and chunks:
            top = chunks[-1]
            offset = self._offset
            available = len(top) - offset
            if available <= remaining:
                out += top[offset:] if offset else top
                self._drop_top()
                remaining -= available
            else:
                out += top[offset:offset + remaining]
                self._offset = offset + remaining
                remaining = 0
        self._num_freed -= num_blocks - remaining
        if remaining:
            start = self._num_handed
            self._num_handed = start + remaining
            out += shared_ints(start + remaining)[start:start + remaining]
        return out

    def append_new_blocks(self, tables: list[list[int]]) -> None:
        """Without caching: one block popped onto the end of each table, in the order listed, exactly as
        ``get_new_blocks(len(tables))`` would hand them out — without building that list (a decode run
        hands out a block or two at a time, many times per request)."""
        if self.enable_caching:
            raise ValueError("append_new_blocks is the caching-off path; with caching use get_new_blocks")
        n = len(tables)
        if n > self.num_blocks - self._num_handed + self._num_freed + len(self._front):
            raise ValueError(f"asked for {n} blocks, {self.num_free} free")
        # Typed as objects, block ids go from list to list as they are (the compiled build would unbox and
        # re-box each one).
        chunks: list[list[Any]] = self._chunks
        for i in range(n):
            table: list[Any] = tables[i]
            if chunks:
                top = chunks[-1]
                offset = self._offset
                table.append(top[offset])
                self._num_freed -= 1
                if offset + 1 == len(top):
                    self._drop_top()
                else:
                    self._offset = offset + 1
            else:
                table.append(shared_ints(self._num_handed + 1)[self._num_handed])
                self._num_handed += 1

    def touch(self, blocks: Iterable[int], stop: int = -1, start: int = 0) -> None:
        """Take a reference on prefix-hit blocks (``blocks[start:stop]``; to the end when ``stop`` is
        negative); a free one leaves the queue (it is no longer evictable)."""
        ref = self._ref
        hits: list[int] = blocks if isinstance(blocks, list) else list(blocks)  # compiled: an indexed loop
        num: i64 = len(hits)
        if 0 <= stop < num:
            num = stop
        i: i64 = start
        while i < num:
            block_id = hits[i]
            count = ref[block_id]
            if count == 0:
                self._num_freed -= 1  # its queue entry goes stale
            ref[block_id] = count + 1  # not ``+= 1``: compiled, an augmented item assignment is a generic add
            i += 1
        if len(self._freed) - self._freed_head > 2 * self._num_freed + _COMPACT_SLACK:
            self._compact()

    def hold(self, pin: Pin) -> None:
        """``touch(pin.blocks)`` for one more holder of the pin: its first holder's references are the pin's
        own, a later holder's a count."""
        if not pin.holders:
            self.touch(pin.blocks)
            self._held_pins.add(pin)
        pin.holders += 1

    def _let_go(self, pin: Pin) -> None:
        """One holder of the pin gone: the last one's references are dropped, last block first (as that
        holder's release of its table's first blocks would have)."""
        pin.holders -= 1
        if not pin.holders:
            self._held_pins.discard(pin)
            blocks = pin.blocks
            self._release(blocks, len(blocks) - 1, -1, -1)

    def free_table(self, table: list[int], pin: Pin | None = None) -> None:
        """Free a request's blocks tail first: ``free_blocks(reversed(table))``; ``pin``: the table's first
        blocks are the pin's, held through it (``hold``). Without caching the pool keeps ``table`` itself as
        the top of the stack (the caller must not use the list again)."""
        if self.enable_caching:
            if pin is None:
                self._release(table, len(table) - 1, -1, -1)
            else:
                self._release(table, len(table) - 1, len(pin.blocks) - 1, -1)
                self._let_go(pin)
            return
        self._push_chunk(table)

    def free_marked_table(self, table: list[int], start: int, stop: int, pin: Pin | None = None) -> None:
        """``free_table`` for a finished request whose blocks ``table[start:stop]`` are marked (``cache_range``):
        they reach the tail of the queue as one run, in the order ``free_blocks`` would have queued them,
        between the partly filled blocks after them (to the front) and its blocks before them. The pool takes
        ``table`` over (the caller must not use the list again): the run is the table itself, cut to it, in
        table order, and handed out from its end (last block first, as ``free_blocks`` queues a table), cut
        as it goes: a chain's next turn takes what is left in its own order, with no copy to reverse.
        ``pin``: the table's first blocks are the pin's, held through it (``hold``; at most ``start`` of them)."""
        if stop < len(table):
            self._release(table, len(table) - 1, stop - 1, -1)
            del table[stop:]
        freed: list[Any] = self._freed  # block ids, and runs of them
        freed.append(table)
        self._num_freed += stop - start
        self._num_in_runs += stop - start
        if start:
            # Read in place, before the table becomes the run.
            if pin is None:
                self._release(table, start - 1, -1, -1)
            else:
                self._release(table, start - 1, len(pin.blocks) - 1, -1)
                self._let_go(pin)
            del table[:start]

    def take_run(self, run: list[int]) -> int:
        """Take what is left of a run as prefix hits of a later request of its chain (``KVManager``, which
        read them off the run, in table order); returns how many. The blocks leave the queue and stay
        referenced once, now by the taker. They stop counting as marked here: the taker marks them again as
        it caches them (``cache_range``), as the index would take a hit block back without a new entry. The
        run stays in the queue, empty, and is passed over."""
        freed: list[Any] = self._freed
        head = self._freed_head
        if head < len(freed) and freed[head] is run:
            self._freed_head = head + 1
        num = len(run)
        run.clear()
        self._num_freed -= num
        self._num_in_runs -= num
        self._num_marked -= num
        return num

    def index_run(self, run: list[int], block_hashes: tuple[int, ...], start: int) -> None:
        """Index the queued blocks of a run after all (something may look them up through the index now):
        each becomes a free block of its own, queued where the run is, in the order the run hands them out
        (last first), and indexed under its hash in that order, as if it had been indexed when cached.
        ``block_hashes`` are the hashes of the run's table and ``start`` the table position of the run's first
        block (the run is what is left of ``table[start:stop]``: its first blocks, in table order)."""
        freed: list[Any] = self._freed
        head: i64 = self._freed_head
        position: i64 = head
        count: i64 = len(freed)
        while position < count and freed[position] is not run:
            position += 1
        if position == count:
            raise ValueError("index_run: the run is not queued")
        size: i64 = len(run)
        hashes: tuple[Any, ...] = block_hashes
        state_ref = self._ref
        entries = self._entries
        hash_of: list[Any] = self._hash_of
        cached: dict[Any, Any] = self.cached
        first: i64 = start
        i: i64 = size - 1
        while i >= 0:
            held = run[i]
            block_id: int = held
            block_hash = hashes[first + i]
            state_ref[block_id] = 0
            entries[block_id] = entries[block_id] + 1
            hash_of[block_id] = block_hash
            if cached.setdefault(block_hash, held) is not held:
                self._copies.setdefault(block_hash, []).append(held)
                self.copies_made += 1
            elif self._shared is not None:
                self._share(block_hash)
            i -= 1
        freed[position:position + 1] = run[::-1]
        self._num_in_runs -= size
        self._num_marked -= size
        run.clear()

    def _drop_top(self) -> None:
        """The top chunk is all out: the one below (if any) is the top again, with its offset."""
        self._chunks.pop()
        self._offset = self._offsets.pop() if self._chunks else 0

    def _push_chunk(self, chunk: list[int]) -> None:
        chunks = self._chunks
        if chunks:
            self._offsets.append(self._offset)  # the covered top keeps its place
            self._offset = 0
        chunks.append(chunk)
        self._num_freed += len(chunk)
        if self._num_freed > self._num_handed:
            raise AssertionError("blocks freed more often than referenced")

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in the order given; blocks reaching zero go to the tail."""
        if not self.enable_caching:
            # Without the prefix cache nothing is shared: every block freed goes on the stack, the last
            # one given on top. A double free shows as more free blocks than were handed out.
            chunk = list(blocks)
            if chunk:
                chunk.reverse()
                self._push_chunk(chunk)
            return
        given: list[Any] = blocks if isinstance(blocks, list) else list(blocks)
        self._release(given, 0, len(given), 1)

    def _release(self, blocks: list[int], first: int, last: int, step: int) -> None:
        """``free_blocks`` (with caching) of ``blocks[first]``, ``blocks[first + step]``, ... up to before
        ``blocks[last]``: a table's part read in place, either way, without a list of its own."""
        freed: list[Any] = self._freed
        ref = self._ref
        entries = self._entries
        # Ids held as objects too: compiled, the queue takes the very object (an id boxed anew per free
        # would be an allocation); the int indexes the per-block lists.
        given: list[Any] = blocks
        hash_of = self._hash_of
        unhashed: list[int] = []
        unhashed_first = self.unhashed_first
        queued: i64 = 0
        i: i64 = first
        end: i64 = last
        stride: i64 = step
        while i != end:
            held = given[i]
            i += stride
            block_id: int = held
            count = ref[block_id] - 1
            ref[block_id] = count
            if count == 0:
                if unhashed_first and hash_of[block_id] is None:
                    unhashed.append(block_id)
                    continue
                freed.append(held)
                queued += 1
                entries[block_id] = entries[block_id] + 1
            elif count < 0:
                self._num_freed += queued
                raise AssertionError(f"block {block_id} freed more often than referenced")
        self._num_freed += queued
        if unhashed:
            # To the front, in the order freed: the first of them is handed out first (the stack's top).
            unhashed.reverse()
            self._front += unhashed

    def cache_blocks(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        """Index each (block, hash) pair in order; a block already indexed is left as it is, and a hash
        another block already holds is indexed as a further copy (lookups keep answering with the oldest)."""
        if len(block_ids) != len(block_hashes):
            raise ValueError(f"{len(block_ids)} blocks but {len(block_hashes)} hashes")
        self.cache_range(list(block_ids), tuple(block_hashes), 0, len(block_ids))

    def cache_range(self, block_ids: list[int], block_hashes: tuple[int, ...], start: int, stop: int,
                    private_from: int = NOT_PRIVATE) -> None:
        """``cache_blocks(block_ids[start:stop], block_hashes[start:stop])`` without the slices: a request's
        table and hashes, indexed from its first block not yet indexed. Blocks from ``private_from`` on hold
        hashes private to the request, which will not look them up while they are marked: they are marked
        instead of indexed (with a listener, ``on_cache`` or ``on_evict``, every block is indexed)."""
        if not self.enable_caching:
            return
        if private_from <= start and self.on_cache is None and self.on_evict is None:
            # All of them private (most calls: a request's own decode blocks, one at a time): marked, which is
            # a count, without the set-up below.
            self._num_marked += stop - start
            return
        # Ids and hashes typed as objects: compiled, they go from list to dict as they are (as ints they would
        # be unboxed and boxed anew for every dict operation). Indexed, not zip(strict=True): that zip is a
        # generic keyword call.
        ids: list[Any] = block_ids
        hashes: tuple[Any, ...] = block_hashes
        hash_of = self._hash_of
        cached: dict[Any, Any] = self.cached
        on_cache = self.on_cache
        i: i64 = start
        count: i64 = stop
        mark: i64 = private_from
        if mark < count and (on_cache is not None or self.on_evict is not None):
            mark = count
        indexed: i64 = mark if mark < count else count
        if indexed < count:
            # The request's own fresh blocks, none indexed: marked by count alone.
            self._num_marked += count - (indexed if indexed > start else start)
        while i < indexed:
            held = ids[i]
            block_id: int = held  # the list index (an object index would be a generic item access)
            if hash_of[block_id] is None:
                block_hash = hashes[i]
                hash_of[block_id] = block_hash
                # One probe of the index (a large dict read at random) whether the hash is new or not.
                if cached.setdefault(block_hash, held) is not held:
                    self._copies.setdefault(block_hash, []).append(held)
                    self.copies_made += 1
                else:
                    if self._shared is not None:
                        self._share(block_hash)
                    if on_cache is not None:
                        on_cache(block_hash)
            i += 1

    def index_private(self, block_ids: list[int], block_hashes: tuple[int, ...], start: int, stop: int) -> None:
        """Index a request's marked blocks ``block_ids[start:stop]`` under their hashes, in order, as
        ``cache_range`` would have (the request may look them up from now on)."""
        self._num_marked -= stop - start
        self.cache_range(block_ids, block_hashes, start, stop)

    def _compact(self) -> None:
        """Rebuild the freed queue from its live entries, in order (stale entries only cost memory): every
        queued block's entry count drops to zero as they are found, and the live ones' go back to one.

        A run stays the very list it was (what is left of it): a session's chain refers to its run by
        identity (``take_run``, ``index_run``), and reads what is left of it off the run itself."""
        live = self._take_live(self._entries, flatten=False)
        entries = self._entries
        for held in live:
            if not isinstance(held, list):
                entries[held] = 1
        self._freed = live
        self._freed_head = 0

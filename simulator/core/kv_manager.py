"""KV cache manager: per-request block tables on top of the block pool.

It answers the scheduler's one question, "give me slots for N new tokens of this request", with the new
blocks or ``None`` (and the scheduler preempts on ``None``). It also finds the longest cached prefix of a
request and keeps the usage figures a replica reports. It decides nothing about who runs.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from simulator.core.block_pool import NOT_PRIVATE, BlockPool, Pin
from simulator.core.request import Request

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


@dataclass(frozen=True, slots=True)
class KVStats:
    """A replica's KV usage at one instant."""

    num_blocks: int
    num_used_blocks: int
    """Blocks referenced by at least one request."""
    num_cached_blocks: int
    """Blocks indexed by the prefix cache (referenced or evictable)."""
    num_stored_tokens: int
    """Tokens whose KV is held for running requests (shared prefix blocks counted once)."""
    num_reserved_unused_slots: int
    """Slots allocated to requests but not (yet) holding a token: fragmentation and reservations."""
    num_tail_slack_slots: int
    """Of those, the slots in each request's last partial block: the floor any block allocator pays."""
    block_size: int

    @property
    def used_frac(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def waste_frac(self) -> float:
        """Reserved-but-unused share of the allocated slots."""
        used = self.num_used_blocks * self.block_size
        return self.num_reserved_unused_slots / used if used else 0.0

    @property
    def waste_beyond_tail_frac(self) -> float:
        """Unused allocated share beyond each request's last partial block."""
        used = self.num_used_blocks * self.block_size
        return (self.num_reserved_unused_slots - self.num_tail_slack_slots) / used if used else 0.0


_PREFIX_WALKS_KEPT: Final = 1024
"""Shared prefixes whose last walk ``KVManager._walk_prefix`` keeps at most."""


class _Chain:
    """A session's chained blocks on one replica (``Request.chain_from``): those of the latest turn to hold
    KV here, from ``start``, marked in the pool rather than indexed. While that turn runs they are in its
    table; once it finished, in the run it left in the pool's queue (``run``: what is left of the table's
    blocks from ``start`` on, in table order), which the session's next turn here takes over whole as its
    prefix hits."""

    __slots__ = ("holder", "run", "start")

    def __init__(self, holder: Request, start: int) -> None:
        self.holder = holder
        self.run: list[int] | None = None
        self.start = start


class KVManager:
    """Block tables of the requests holding KV on one replica, over one block pool.

    Private blocks. A request's blocks from ``Request.private_from`` on hold hashes no other request
    carries (the workload promises it: its own prompt and answer). While the request runs for the first time
    here, nobody can look them up: other requests do not carry them, and the request itself looks its chain
    up only on admission. So they are marked in the pool instead of indexed (``BlockPool.cache_range``),
    which costs no index entry, and the manager indexes them after all when the request leaves the device
    unfinished (preempted, aborted, migrated, a prefill worker's hand-off: it may come back and look them
    up), remembering the request id so that its later lives here index as usual. A request that finishes
    never looks its chain up again. Every lookup therefore answers as it would with every block indexed,
    and the pool's order, hand-outs and evictions are the same block for block (a test runs both).

    Chained blocks. A session's turn carries its previous turn's hashes as its first ones, and past the system
    prompt (from ``Request.chain_from``) nothing but the session's turns carries them (the workload
    promises it). Those blocks are marked too, and handed from turn to turn without the index: a turn that
    finishes leaves them as a run in the pool's queue (``_Chain``), and the session's next turn here, whose
    lookup reaches the chain (its system prompt all cached), takes what is left of the run whole as its hits
    (``BlockPool.take_run``), exactly the blocks a walk of the index would find: evictions take a run from
    its table's tail, so what is left is always the chain's first blocks. Wherever that could differ (the
    lookup misses before the chain or would stop inside it, two turns of a session hold KV here at once, a
    turn leaves unfinished, a listener reads every hash), the chain is indexed after all (``_open_chain``)
    and the session's blocks here are indexed like any others from then on. A fleet serving multi-turn
    chat then keeps only the system prompts in its indexes, not every turn's every block.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True,
                 unhashed_first: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching, unhashed_first=unhashed_first)
        self.req_blocks: dict[int, list[int]] = {}
        """Block table (block ids, in token order) of each request holding KV, by request id: the same
        lists as the requests' own ``block_table`` (which the per-step paths read)."""
        self.num_hit_tokens = 0
        """Prompt tokens served from the prefix cache, over the manager's life."""
        self.num_lookup_tokens = 0
        """Prompt tokens looked up in the prefix cache (the denominator of the hit rate)."""
        self._exposed: set[int] = set()
        """Requests whose private blocks were indexed here as they left unfinished: their private blocks are
        indexed as usual from then on (one id per request preempted, aborted or moved here)."""
        self.chains_on = True
        """Whether sessions' turns hand their chained blocks on here (off where blocks arrive from another
        replica: disaggregation)."""
        self._chains: dict[Any, _Chain] = {}
        """The chains held here, by their first hash (the hash at ``chain_from``, alike in every turn)."""
        self._open_chains: set[Any] = set()
        """Chains indexed after all (``_open_chain``): their sessions' blocks here are indexed as usual."""
        self._swept_at = 64
        """``_chains`` is swept of chains with nothing left when it outgrows this."""
        self._prefix_walks: dict[Any, tuple[Pin, int]] = {}
        """First hash of a chain's shared prefix -> the blocks its last walk found (as a pin), and the pool's
        count of copies made then (``_walk_prefix``)."""
        self._walked: Pin | None = None
        """The pin of the blocks the last ``_walk_prefix`` found (None: it found none)."""
        self._pin: Pin | None = None
        self._pin_hits: list[Any] | None = None
        """The pin the last lookup's hits begin with, and those hits: ``allocate``, given them, holds the pin
        instead of referencing its blocks one by one."""
        self._claim: _Chain | None = None
        self._claimer: Request | None = None
        self._claimed = 0
        """The chain whose run the last lookup answered with, its request, and how many of the run's blocks
        ended its hits: ``allocate`` takes them."""
        self._last_looked_up: Request | None = None
        self._last_hits: list[Any] = []
        self._last_copies_made = 0
        """The last lookup's request and answer (``get_computed_blocks``): a queue's head that cannot be
        admitted is looked up again every step, and is answered from here when the pool shows that the same
        walk would find the same blocks (``BlockPool.holds_prefix``)."""

    @property
    def reads_every_hash(self) -> bool:
        """Whether every hash of a request is read (a listener, the KV tiers, is told of each block cached or
        evicted): requests must then hold their private tails as values (``Request.expose_hashes``)."""
        pool = self.pool
        return pool.on_cache is not None or pool.on_evict is not None

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def get_computed_blocks(self, request: Request) -> list[int]:
        """Blocks holding the longest cached prefix of the request: whole blocks, capped at tokens − 1
        (the last token is always recomputed so that the step produces its logits)."""
        if not self.enable_caching or not request.num_hashed_blocks:
            return []
        # min() and ``num_tokens`` spelled out (a builtin call and a property call, interpreted)
        max_blocks = (request.num_prompt_tokens + request.num_output_tokens - 1) // self.block_size
        hashed = request.num_hashed_blocks
        if hashed < max_blocks:
            max_blocks = hashed
        # Hashes and ids as objects (see BlockPool.cache_blocks): compiled, no unboxing and re-boxing.
        cached: dict[Any, Any] = self.pool.cached
        hashes: tuple[Any, ...] = request.block_hashes
        if len(hashes) < max_blocks:
            if self._indexes_own(request):
                # A life of it may have indexed its own blocks here: look them all up.
                request.expose_hashes()
                hashes = request.block_hashes
            else:
                # Its tail is not derived, and no life of it indexes its own blocks here: this cache cannot
                # hold a private one, so the lookup ends at the first (a miss, either way).
                max_blocks = min(max_blocks, max(len(hashes), request.private_from))
        self._claim = None
        self._pin = None
        key = self._chain_key(request)
        if key is not None:
            return self._chained_lookup(request, key, max_blocks)
        if len(hashes) < max_blocks:
            # A session's blocks past its chain's first, which its earlier turns may have indexed here.
            request.expose_hashes()
            hashes = request.block_hashes
        if request is self._last_looked_up:
            held = self.pool.held_prefix(self._last_hits, hashes, max_blocks, self._last_copies_made)
            if held >= 0:
                # The blocks found last time still hold these hashes up to where a walk would stop now: an
                # overloaded replica's blocked head costs one check per hit block here, not one index probe.
                last = self._last_hits
                if held < len(last):
                    del last[held:]
                return list(last)
        # The list at its largest size first, cut after the walk: appending would grow (reallocate and copy)
        # it a dozen times for a hundred hits.
        hits: list[Any] = [None] * max_blocks
        count: i64 = 0
        while count < max_blocks:
            block = cached.get(hashes[count])
            if block is None:
                break
            hits[count] = block
            count += 1
        if count < max_blocks:
            del hits[count:]
        self._last_looked_up = request
        self._last_hits = hits
        self._last_copies_made = self.pool.copies_made
        return list(hits)

    def _walk(self, hashes: tuple[Any, ...], start: int, stop: int, hits: list[Any]) -> int:
        """Append the blocks the index holds for ``hashes[start:stop]`` to ``hits``, up to the first miss;
        returns where the walk stopped."""
        cached: dict[Any, Any] = self.pool.cached
        i: i64 = start
        end: i64 = stop
        while i < end:
            block = cached.get(hashes[i])
            if block is None:
                break
            hits.append(block)
            i += 1
        return i

    def _walk_prefix(self, hashes: tuple[Any, ...], stop: int, hits: list[Any]) -> int:
        """``_walk(hashes, 0, stop, hits)`` for a chain's shared prefix (its system prompt): answered from
        the last walk that began with the same hash when its blocks still hold these very hashes and a walk
        would stop where it did (``BlockPool.holds_prefix``); one list read per block rather than an index
        probe (the prefix's hashes are the same objects in every request: ``SharedHashes``)."""
        self._walked = None
        if stop <= 0:
            return 0
        walks = self._prefix_walks
        first = hashes[0]
        last = walks.get(first)
        if last is not None and (self.pool.holds_pin(last[0], hashes, stop)
                                 or self.pool.holds_prefix(last[0].blocks, hashes, stop, last[1])):
            pin = last[0]
            hits += pin.blocks
            self._walked = pin
            return len(pin.blocks)
        start = len(hits)
        count = self._walk(hashes, 0, stop, hits)
        if len(walks) >= _PREFIX_WALKS_KEPT:
            walks.clear()
        if count:
            blocks = hits[start:start + count]
            # The same blocks as the last walk's (a copy made elsewhere voided the answer, not these blocks):
            # the same pin, so that its holders and the ones to come share it.
            found = hashes[:count]
            if last is not None and last[0].blocks == blocks:
                pin = last[0]
                pin.hashes = found  # what its blocks hold now (evicted and cached anew while it had no holders)
            else:
                pin = Pin(blocks, found)
            walks[first] = (pin, self.pool.copies_made)
            self._walked = pin
        else:
            walks.pop(first, None)
        return count

    def _chain_key(self, request: Request) -> Any:
        """The first hash of the request's chain when it hands chained blocks on here, else None."""
        start = request.chain_from
        if start >= NOT_PRIVATE or not self.chains_on:
            return None
        hashes: tuple[Any, ...] = request.block_hashes
        if len(hashes) <= start or self.reads_every_hash or self._indexes_own(request):
            return None
        key = hashes[start]
        return None if key in self._open_chains else key

    def _chained_lookup(self, request: Request, key: Any, max_blocks: int) -> list[int]:
        """``get_computed_blocks`` for a request with a chain: the index up to the chain, then what is left
        of the run its session's last turn here left, taken whole (``allocate`` takes it over)."""
        start = request.chain_from
        hashes: tuple[Any, ...] = request.block_hashes
        hits: list[Any] = []
        chain = self._chains.get(key)
        if chain is not None and chain.run is None:
            # Another turn of the session holds KV here: what it caches is what a walk would find.
            self._open_chain(key)
            self._walk(self._values(request, max_blocks), 0, max_blocks, hits)
            return hits
        count = self._walk_prefix(hashes, start if start < max_blocks else max_blocks, hits)
        self._pin = self._walked  # the hits begin with its blocks, whatever this lookup adds to them
        self._pin_hits = hits
        run = None if chain is None else chain.run
        if run is None or count < start or start >= max_blocks:
            if run is not None and count < start and run:
                # The walk misses before the chain: this request computes the chain's blocks again, and
                # the cached ones, older, would be the copies a walk finds from now on.
                self._open_chain(key)
            return hits
        live = len(run)  # what is left of the run (the pool cuts it as it hands its blocks out)
        if not live:
            return hits
        if start + live > max_blocks:
            self._open_chain(key)  # a walk would stop inside the run: the rest would be copies to find
            self._walk(self._values(request, max_blocks), count, max_blocks, hits)
            return hits
        hits += run  # what is left of the run: its blocks, in table order (``BlockPool.free_marked_table``)
        self._claim = chain
        self._claimer = request
        self._claimed = live
        return hits

    @staticmethod
    def _values(request: Request, stop: int) -> tuple[Any, ...]:
        """The request's hashes, as values at least to block ``stop`` (its tail derived if they end before)."""
        if len(request.block_hashes) < stop:
            request.expose_hashes()
        return request.block_hashes

    def _open_chain(self, key: Any) -> None:
        """Index a chain's blocks after all, as they would have been indexed when cached: a holder's marked
        blocks (and the ones it caches from now on), or the run it left; the session's blocks here are
        indexed like any others from now on."""
        self._open_chains.add(key)
        chain = self._chains.pop(key, None)
        if chain is None:
            return
        holder = chain.holder
        run = chain.run
        if run is None:
            mark = holder.mark_from
            indexed = holder.num_indexed_blocks
            holder.mark_from = NOT_PRIVATE
            holder.expose_hashes()
            if indexed > mark:
                self.pool.index_private(holder.block_table, holder.block_hashes, mark, indexed)
            self._exposed.add(holder.request_id)  # its own blocks are indexed now: its later lives index too
        elif run:
            holder.expose_hashes()
            self.pool.index_run(run, holder.block_hashes, chain.start)

    def _sweep_chains(self) -> None:
        """Drop the chains with nothing left (their runs handed out): sessions that did not come back."""
        self._chains = {key: chain for key, chain in self._chains.items()
                        if chain.run is None or chain.run}
        self._swept_at = max(64, 2 * len(self._chains))

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> int:
        """How many leading blocks of this hash chain the cache holds now (for prefix-aware routing).
        ``num_blocks``: the chain's length when ``block_hashes`` are only its first values (a spec's
        ``known_hashes``; ``num_lookup_blocks``): a session's chained blocks count to there, and a walk that
        uses up the values answers their length (the caller derives the rest and asks again)."""
        if not self.enable_caching:
            return 0
        cached: dict[Any, Any] = self.pool.cached
        # A tuple (a spec's hashes, as the router passes them), indexed: compiled, a loop over a Sequence is
        # generic iteration (sessions+prefix-aware, 10,000 requests: 6.46 -> 5.59 G instructions). The hashes
        # stay objects: no unboxing and re-boxing for the lookups.
        hashes: tuple[Any, ...] = block_hashes if isinstance(block_hashes, tuple) else tuple(block_hashes)
        count: i64 = len(hashes)
        i: i64 = 0
        while i < count and hashes[i] in cached:
            i += 1
        return self.chain_match(hashes, i, num_blocks)

    def chain_match(self, block_hashes: tuple[Any, ...], num_indexed: int, num_blocks: int | None = None) -> int:
        """``prefix_match_blocks`` given the walk's answer in the index: ``block_hashes[:num_indexed]`` are in
        it and the next is not (or none is next). A session's chain starting there (its blocks marked, not
        indexed) is what a walk would find on. A fleet-wide index (``fleet.prefix_index``) walks the index
        for every replica at once and asks each replica only this."""
        if not self.enable_caching:
            return 0
        i: i64 = num_indexed
        count: i64 = len(block_hashes)
        if i < count and self._chains:
            chain = self._chains.get(block_hashes[i])
            if chain is not None and chain.start == i:
                # A chain starts here: its run, or what its holder has cached, is what a walk would find.
                run = chain.run
                live = chain.holder.num_indexed_blocks - i if run is None else len(run)
                if live > 0:
                    end: i64 = count if num_blocks is None else num_blocks
                    i += min(live, end - i)
        return i

    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_hit_blocks: int = 0,
                          reserve_tokens: int = 0) -> int:
        """Fresh blocks ``allocate`` would pop for these arguments."""
        num_tokens = request.num_computed_tokens + num_hit_blocks * self.block_size + num_new_tokens
        if reserve_tokens > num_tokens:  # max() spelled out (per admission check: a builtin call each, interpreted)
            num_tokens = reserve_tokens
        need = -(-num_tokens // self.block_size) - len(request.block_table) - num_hit_blocks
        return need if need > 0 else 0

    def allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
        reserve_tokens: int = 0,
    ) -> int | None:
        """Slots for ``num_new_tokens`` more tokens (after ``new_computed_blocks``, a prefix hit taken on
        admission), and for at least ``reserve_tokens`` tokens in all (contiguous and reserve policies
        allocate their whole reservation up front). Returns how many fresh blocks it popped (the table's
        new tail), or None if they do not fit; on None nothing changed."""
        blocks = request.block_table
        if blocks and not new_computed_blocks:
            # Fast path (most calls: a decode inside a block it already holds): nothing to pop.
            num_done = request.num_computed_tokens + num_new_tokens
            if num_done <= len(blocks) * self.block_size:
                if self.enable_caching and num_done // self.block_size > request.num_indexed_blocks:
                    self._cache_full_blocks(request, blocks, num_new_tokens, 0)
                return 0
        num_new = self.num_blocks_needed(request, num_new_tokens, len(new_computed_blocks), reserve_tokens)
        claim = self._claim
        taken = 0
        if claim is not None:
            self._claim = None
            if self._claimer is request and new_computed_blocks and claim.run is not None:
                taken = len(claim.run)
                if taken != self._claimed:  # the hits end with the blocks the run held at the lookup
                    raise AssertionError("allocate: the chain's run changed since the lookup")
        # Hit blocks nobody references sit in the free queue: taking them consumes free capacity too (a run's
        # blocks, taken over, all of them).
        num_free = self.pool.num_free
        if num_new + taken > num_free:
            return None  # short even before the hits are counted (a blocked queue head, step after step)
        # The pin the lookup's hits begin with (``_walk_prefix``), held as one (``BlockPool.hold``).
        pin = self._pin if new_computed_blocks is self._pin_hits and not blocks else None
        skip = 0  # hit blocks held through the pin: none of them free while it has holders
        if pin is not None and pin.holders:
            skip = len(pin.blocks)
        evictable_hits = 0
        if new_computed_blocks:  # a run's blocks are never referenced: only the ones before it are read
            evictable_hits = self.pool.num_unreferenced(new_computed_blocks, len(new_computed_blocks) - taken,
                                                        skip) + taken
        if num_new + evictable_hits > num_free:
            return None
        self._pin = None
        self._pin_hits = None
        to_pop = num_new
        if not blocks:
            mark = request.mark_from = self._mark_from(request, claim if taken else None)
            if len(request.block_hashes) < min(mark, request.num_hashed_blocks):
                request.expose_hashes()  # every block it fills before the mark is indexed: with its hash
            if num_new and not new_computed_blocks:
                # The request starts holding KV: the pool's new list becomes its table (no copy).
                blocks = request.block_table = self.pool.get_new_blocks(num_new)
                to_pop = 0
            self.req_blocks[request.request_id] = blocks  # the request starts holding KV (or may: an empty table)
        if new_computed_blocks:
            start = 0
            if pin is not None:
                self.pool.hold(pin)  # as touching its blocks would (they come first)
                request.pin = pin
                start = len(pin.blocks)
            if taken and claim is not None and claim.run is not None:
                num_indexed = len(new_computed_blocks) - taken
                if num_indexed > start:
                    self.pool.touch(new_computed_blocks, num_indexed, start)
                self.pool.take_run(claim.run)
                claim.run = None
                claim.holder = request
            else:
                self.pool.touch(new_computed_blocks, -1, start)
            blocks.extend(new_computed_blocks)
        if to_pop:
            self.pool.get_new_blocks(to_pop, blocks)
        if self.enable_caching and request.num_hashed_blocks:
            if pin is not None:
                # The pin's blocks are the index's answers, each holding its hash (held now: none is evicted),
                # which indexing passes over: it starts after them (or at the mark), to the same end.
                request.num_indexed_blocks = min(len(pin.blocks), request.mark_from)
            self._cache_full_blocks(request, blocks, num_new_tokens, len(new_computed_blocks))
        return num_new

    def _mark_from(self, request: Request, claim: _Chain | None = None) -> int:
        """The first block of this request to mark private rather than index, as it starts holding KV:
        ``NOT_PRIVATE`` when it may look its chain up here before it finishes (``_indexes_own``). A request
        with a chain here holds it from now on (``claim``: the one whose run it takes over), unless another
        turn of its session holds KV here or left blocks its lookup did not take: that chain is indexed."""
        key = self._chain_key(request)
        if key is not None:
            chain = self._chains.get(key)
            if chain is not None and chain is not claim and (chain.run is None or chain.run):
                self._open_chain(key)
            else:
                if chain is None or chain is not claim:
                    self._chains[key] = _Chain(request, request.chain_from)
                    if len(self._chains) > self._swept_at:
                        self._sweep_chains()
                return request.chain_from
        elif self.chains_on and request.chain_from < len(request.block_hashes):
            # A turn that indexes its session's blocks here (it left unfinished before, or a listener reads
            # every hash): the session's chain here is indexed too, and stays so.
            self._open_chain(request.block_hashes[request.chain_from])
        if request.private_from >= NOT_PRIVATE or self._indexes_own(request):
            return NOT_PRIVATE
        return request.private_from

    def _indexes_own(self, request: Request) -> bool:
        """Whether the request's own blocks are indexed here like any other: it ran here before and left
        unfinished (every later life here looks its chain up), or it is a prefill worker's request, which
        always leaves unfinished, or a listener reads every hash. True for every life of a request here
        once true for one, so a life for which it is false cannot find a block of its own here."""
        return (request.max_output_tokens < request.spec.output_tokens or request.request_id in self._exposed
                or self.reads_every_hash)

    def appends_in_place(self, request: Request) -> bool:
        """Whether ``allocate(request, 1)`` would return [] having changed nothing: the request's next
        token falls in a block it already holds and, with the prefix cache, completes no block (so there
        is nothing to index). The scheduler skips the call for such decode rows."""
        computed = request.num_computed_tokens
        bs = self.block_size
        if computed >= len(request.block_table) * bs:
            return False
        if not self.enable_caching:
            return True
        if request.num_output_placeholders:
            # Async scheduling: ``allocate`` indexes only blocks full of tokens already known.
            # min() spelled out (here and below, per decode row: a builtin call each, interpreted).
            known = request.num_prompt_tokens + request.num_output_tokens
            if computed + 1 < known:
                known = computed + 1
            num_full = known // bs
            hashed = request.num_hashed_blocks
            return (num_full if num_full < hashed else hashed) <= request.num_indexed_blocks
        return (computed + 1) % bs != 0

    def append_decode_token(self, request: Request, position: int, num_tokens: int) -> None:
        """``allocate(request, 1)`` for a decode token at ``position`` of a request holding its blocks, when
        the request has ``num_tokens`` tokens and the pool has a free block: a fresh block if the token
        starts one, then the blocks full of known tokens indexed. What a decode run does on the steps where
        a request's KV changes, without setting the request's counters to that step."""
        table = request.block_table
        bs = self.block_size
        if position >= len(table) * bs:
            self.pool.append_new_block(table)
        if not self.enable_caching:
            return
        # ``index_known_tokens`` spelled out (a call per event fewer, interpreted).
        num_full = (position + 1 if position < num_tokens else num_tokens) // bs
        hashed = request.num_hashed_blocks
        if hashed < num_full:
            num_full = hashed
        start = request.num_indexed_blocks
        if num_full > start:
            self.pool.cache_range(table, request.block_hashes, start, num_full, request.mark_from)
            request.num_indexed_blocks = num_full

    def index_known_tokens(self, request: Request, num_tokens: int) -> None:
        """The blocks full of a request's first ``num_tokens`` tokens (known, their KV computed or being
        computed) indexed, none allocated: ``append_decode_token``'s indexing, and, alone, what ``update``
        indexes for a request that the next decision leaves out (its last token is in flight), as a decode
        run applies that decision."""
        if self.enable_caching:
            num_full = num_tokens // self.block_size
            hashed = request.num_hashed_blocks
            if hashed < num_full:
                num_full = hashed
            start = request.num_indexed_blocks
            if num_full > start:
                self.pool.cache_range(request.block_table, request.block_hashes, start, num_full, request.mark_from)
                request.num_indexed_blocks = num_full

    def append_blocks(self, tables: list[list[int]]) -> None:
        """One fresh block at the end of each listed table (a request's ``block_table``, the list itself),
        popped in the order listed (a table listed twice gets two): ``allocate(request, 1)`` for decode
        tokens that start a block, when prefix caching is off. The caller (a decode run) has checked that
        the pool holds them all."""
        if self.enable_caching:
            raise ValueError("append_blocks is the caching-off path; with caching use allocate")
        self.pool.append_new_blocks(tables)

    def _cache_full_blocks(self, request: Request, blocks: list[int], num_new_tokens: int,
                           num_hit_blocks: int) -> None:
        # Index every block that is full once this step's tokens are computed (optimistic, as vLLM: the
        # step that computes them runs before any later lookup can be served).
        num_done = request.num_computed_tokens + num_hit_blocks * self.block_size + num_new_tokens
        self._cache_until(request, blocks, num_done)

    def cache_known_blocks(self, request: Request) -> None:
        """Async scheduling, as a sampled token is delivered: index the blocks now full of known tokens
        whose KV is computed or being computed (vLLM's ``cache_blocks(request, num_computed_tokens -
        num_output_placeholders)``)."""
        if self.enable_caching and request.num_hashed_blocks:
            num_done = request.num_computed_tokens - request.num_output_placeholders
            # Most tokens complete no block: nothing to index (``_cache_until`` indexes at most this far).
            if num_done // self.block_size > request.num_indexed_blocks:
                self._cache_until(request, request.block_table, num_done)

    def _cache_until(self, request: Request, blocks: list[int], num_done: int) -> None:
        num_tokens = request.num_tokens
        num_full = (num_done if num_done < num_tokens else num_tokens) // self.block_size
        hashed = request.num_hashed_blocks
        if hashed < num_full:
            num_full = hashed
        start = request.num_indexed_blocks
        if num_full <= start:
            return
        self.pool.cache_range(blocks, request.block_hashes, start, num_full, request.mark_from)
        request.num_indexed_blocks = num_full

    def record_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.num_lookup_tokens += num_prompt_tokens
        self.num_hit_tokens += num_hit_tokens

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (its longest prefixes are evicted first)."""
        req_blocks = self.req_blocks
        rid = request.request_id
        if rid in req_blocks:  # compiled: two native dict operations (``pop`` with a default is a generic call)
            del req_blocks[rid]
        blocks = request.block_table
        mark = request.mark_from
        indexed = request.num_indexed_blocks
        request.mark_from = NOT_PRIVATE
        request.block_table = []  # the old table leaves the request: the pool takes it over
        request.num_indexed_blocks = 0
        pin = request.pin
        request.pin = None
        key = None
        chain = None
        if mark == request.chain_from and mark < len(request.block_hashes) and self._chains:
            key = request.block_hashes[mark]
            chain = self._chains.get(key)
            if chain is not None and chain.holder is not request:
                chain = None
        if chain is not None:
            del self._chains[key]
        if indexed > mark:
            if request.num_output_tokens >= request.spec.output_tokens:
                self.pool.free_marked_table(blocks, mark, indexed, pin)  # finished: its chain is never looked up again
                if chain is not None:
                    # The run (the table itself, cut to its chained blocks) is what the session's next turn
                    # here takes over; a last turn's too, for an earlier turn may still come back (preempted,
                    # retried) and carries its first chained hashes.
                    chain.run = blocks
                    self._chains[key] = chain
                return
            if chain is not None:
                self._open_chains.add(key)  # leaving unfinished: its blocks are indexed now (below)
            # Leaving unfinished, it may come back and look its chain up: index what was only marked.
            request.expose_hashes()
            self.pool.index_private(blocks, request.block_hashes, mark, indexed)
            self._exposed.add(request.request_id)
        if blocks:
            self.pool.free_table(blocks, pin)

    def block_ids(self, request_id: int) -> list[int]:
        return list(self.req_blocks.get(request_id, ()))

    def num_held_blocks(self, request_id: int) -> int:
        return len(self.req_blocks.get(request_id, ()))

    def stats(self, requests: Sequence[Request]) -> KVStats:
        """Usage now; ``requests`` are the requests holding blocks (the scheduler's running set)."""
        bs = self.block_size
        unused = 0
        tail = 0
        for req in requests:
            held = len(req.block_table) * bs
            stored = min(req.num_computed_tokens, held)
            unused += held - stored
            tail += -stored % bs if stored else 0
        used_blocks = self.pool.num_used
        return KVStats(
            num_blocks=self.pool.num_blocks,
            num_used_blocks=used_blocks,
            num_cached_blocks=self.pool.num_cached,
            num_stored_tokens=used_blocks * bs - unused,
            num_reserved_unused_slots=unused,
            num_tail_slack_slots=tail,
            block_size=bs,
        )

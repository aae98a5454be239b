"""Block hashes a request brings to the prefix cache, derived from integers and never from Python's
salted ``hash()``: equal hashes at block j mean equal content at blocks 0..j. Mooncake's block ids name one
block's content only, so they are chained with a splitmix64 mix; a synthetic block's key already names
everything before it (its stream, whose system prompt is fixed, and its position), so it is its own hash."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, Protocol

import numpy as np

from simulator.core.mix import SPLITMIX_GOLDEN, SPLITMIX_MUL1, SPLITMIX_MUL2
from simulator.workload.traces import MOONCAKE_BLOCK_TOKENS

_GOLDEN = np.uint64(SPLITMIX_GOLDEN)
_MIX1 = np.uint64(SPLITMIX_MUL1)
_MIX2 = np.uint64(SPLITMIX_MUL2)


_ROOT = np.uint64(0x243F6A8885A308D3)
"""Parent of every chain's first block (digits of pi: any fixed constant works)."""


class BlockTag(IntEnum):
    """Namespaces of block content, so a system prompt's block never equals a session's or a trace's."""

    SYSTEM_PROMPT = 1
    SESSION = 2
    REQUEST = 3
    MOONCAKE = 4


def mix_into(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place: a bijection on uint64 that spreads each input bit over the output.

    In place because it runs once per block in ``chain_hashes``; uint64 arrays wrap modulo 2**64 silently.
    """
    z += _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _mix(values: np.ndarray | int) -> np.ndarray:
    """``mix_into`` on a copy."""
    return mix_into(np.array(values, dtype=np.uint64))


def _namespace_key(seed: int, tag: BlockTag) -> np.uint64:
    """A random-looking 64-bit key per (seed, namespace), mixed into every block key of that namespace."""
    return np.uint64(_mix(_mix(seed & 0xFFFF_FFFF_FFFF_FFFF) ^ np.uint64(tag)))


def chain_hashes(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Chain each request's block keys: hash[j] = mix(hash[j - 1] ^ key[j]), hash[-1] = a fixed root.

    ``keys`` holds every request's block keys back to back; request i owns ``keys[offsets[i]:offsets[i+1]]``.
    Equal hashes at block j therefore mean equal keys at blocks 0..j, which is what a prefix cache needs.
    Vectorised over requests, one numpy pass per block position: requests sorted longest first make the
    ones still active at position j a prefix of that order.
    """
    counts = np.diff(offsets)
    hashes = np.empty(len(keys), dtype=np.uint64)
    if len(keys) == 0:
        return hashes
    order = np.argsort(-counts, kind="stable")
    starts = offsets[:-1][order]
    num_active = np.searchsorted(-counts[order], -np.arange(int(counts.max())), side="left")
    parents = np.full(len(order), _ROOT, dtype=np.uint64)
    for position, active in enumerate(num_active.tolist()):
        index = starts[:active] + position
        current = parents[:active]  # a view: the chains advance in place
        current ^= keys[index]
        mix_into(current)
        hashes[index] = current
    return hashes


def block_positions(num_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, owning row, position within the row) for every block of rows with num_blocks each."""
    offsets = np.zeros(len(num_blocks) + 1, dtype=np.int64)
    np.cumsum(num_blocks, out=offsets[1:])
    row = np.repeat(np.arange(len(num_blocks)), num_blocks)
    position = np.arange(offsets[-1], dtype=np.int64) - offsets[row]
    return offsets, row, position


@dataclass(frozen=True)
class SplitHashes:
    """Requests' block hashes as values up to each one's private tail, and the tails as rules
    (``core.request.HashTail``: block j's hash is ``splitmix64(key ^ j)``), not derived."""

    values: np.ndarray
    """The hashes held as values, every request's back to back (uint64)."""
    offsets: np.ndarray
    """Request i's values are ``values[offsets[i]:offsets[i + 1]]``."""
    private_from: np.ndarray
    """Each request's ``private_from`` (-1: none); where it has a tail, its values end there."""
    tail_key: np.ndarray
    """Each request's tail key (uint64; 0 without a tail)."""
    tail_stop: np.ndarray
    """Each request's blocks with a hash: where its tail ends (-1 without a tail)."""


class BlockKeys(Protocol):
    """Content keys of each full block of requests [start, stop), and the block hashes they make."""

    def keys(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys as uint64, offsets of each request's keys, length stop - start + 1)."""
        ...

    def hashes(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(block hashes as uint64, offsets as ``keys``): equal hashes at block j mean equal blocks 0..j."""
        ...

    def private_from(self, start: int, stop: int) -> np.ndarray | None:
        """Index of each request's first block no other request's keys can equal (``RequestSpec.private_from``),
        or None when any block may be shared."""
        ...

    @property
    def repeats_session_prefix(self) -> bool:
        """Whether a session's turn carries every hash of the session's previous turn as its first hashes (the
        workload then hands the later turn the earlier one's hash objects instead of making equal ones)."""
        ...

    @property
    def prefix_blocks(self) -> int:
        """Blocks of a system prompt that every request with that prompt carries alike (0: none)."""
        ...

    def prefix_ids(self, start: int, stop: int) -> np.ndarray | None:
        """Each request's system prompt (-1: none), or None without system prompts."""
        ...

    def prefix_values(self, prompts: list[int]) -> np.ndarray:
        """The ``prefix_blocks`` hashes of each of these system prompts, back to back."""
        ...

    def value_counts(self, start: int, stop: int, lazy_chains: bool = False) -> np.ndarray:
        """How many hashes of each request are values: all of ``hashes``', or ``split_hashes``' up to its tail;
        ``lazy_chains``: a session's turn's values end past its chain's first block, the rest is its tail."""
        ...

    def values_from(self, start: int, stop: int, first: np.ndarray, lazy_chains: bool = False) -> np.ndarray:
        """The value hashes of each request from its block ``first[i]`` on (to ``value_counts``), back to back:
        what a request still needs when its first hashes are another's (``workload.shared_hashes``)."""
        ...

    def tails(self, start: int, stop: int, lazy_chains: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """``split_hashes``' ``tail_key`` and ``tail_stop`` without its values (``value_counts``' tails with
        ``lazy_chains``); None where there are none."""
        ...

    def split_hashes(self, start: int, stop: int) -> SplitHashes | None:
        """The hashes up to each request's private blocks, and those blocks' as tails; None when the keys
        cannot say (every hash is then a value: ``hashes``)."""
        ...


class SyntheticBlockKeys:
    """Blocks of synthetic token streams: an optional shared system prompt, then a private stream.

    A stream is a session's whole conversation or one request's prompt. Block j of a stream covers tokens
    [j * block_size, (j + 1) * block_size): if it lies wholly inside the system prompt its key names
    (system prompt, j), shared by every request with that prompt; otherwise (stream, j), private to the
    stream. Turn k + 1 of a session walks the same stream further, so it repeats turn k's full-block keys
    and the block that straddled the end of turn k gets its first hash, a new one.
    """

    def __init__(
        self,
        *,
        seed: int,
        block_size: int,
        stream_tag: Literal[BlockTag.SESSION, BlockTag.REQUEST],
        stream_id: np.ndarray,
        hashed_tokens: np.ndarray,
        prefix_id: np.ndarray | None = None,
        prefix_tokens: int = 0,
        private_from: np.ndarray | None = None,
    ) -> None:
        self._prefix_tag = _namespace_key(seed, BlockTag.SYSTEM_PROMPT)
        self._stream_tag = _namespace_key(seed, stream_tag)
        self._sessions = stream_tag is BlockTag.SESSION
        self._block_size = block_size
        self._stream_id = stream_id
        self._hashed_tokens = hashed_tokens
        self._prefix_id = prefix_id
        self._prefix_blocks = prefix_tokens // block_size
        if private_from is None and stream_tag is BlockTag.REQUEST:
            # A request's own stream is private past its system prompt's blocks.
            private_from = np.zeros(len(stream_id), dtype=np.int64) if prefix_id is None else \
                np.where(prefix_id >= 0, self._prefix_blocks, 0).astype(np.int64)
        self._private_from = private_from
        """Each request's first block no other request carries (-1: none); None for none at all. Sessions:
        given by the generator, which knows which turn is a session's last."""

    def keys(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return self._keys(start, stop, self._hashed_tokens[start:stop] // self._block_size)

    @property
    def repeats_session_prefix(self) -> bool:
        """A session's stream: turn k + 1 walks it further from the same system prompt, so its first keys are
        turn k's full-block keys (and they hash alike: no chaining)."""
        return self._sessions

    @property
    def prefix_blocks(self) -> int:
        """A block wholly inside the system prompt is keyed by (prompt, position) alone."""
        return self._prefix_blocks if self._prefix_id is not None else 0

    def prefix_ids(self, start: int, stop: int) -> np.ndarray | None:
        return None if self._prefix_id is None else self._prefix_id[start:stop]

    def prefix_values(self, prompts: list[int]) -> np.ndarray:
        """Block j < prefix_blocks of prompt p is keyed by (p, j) and the prompt's tag, as ``_keys`` keys it."""
        position = np.tile(np.arange(self._prefix_blocks, dtype=np.uint64), len(prompts))
        owner = np.repeat(np.asarray(prompts, dtype=np.uint64), self._prefix_blocks)
        return mix_into(((owner << np.uint64(32)) | position) ^ np.uint64(self._prefix_tag))

    def value_counts(self, start: int, stop: int, lazy_chains: bool = False) -> np.ndarray:
        num_blocks = self._hashed_tokens[start:stop] // self._block_size
        tailed = self._tailed(start, stop, num_blocks, lazy_chains)
        return num_blocks if tailed is None else np.where(tailed[1], tailed[0], num_blocks)

    def values_from(self, start: int, stop: int, first: np.ndarray, lazy_chains: bool = False) -> np.ndarray:
        return self._keys(start, stop, self.value_counts(start, stop, lazy_chains), first)[0]

    def tails(self, start: int, stop: int, lazy_chains: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """A tail's block j hashes as ``splitmix64(((stream << 32) | j) ^ tag)``: a private block's key names
        its own stream and position, and so does a session's block past its system prompt."""
        num_blocks = self._hashed_tokens[start:stop] // self._block_size
        tailed = self._tailed(start, stop, num_blocks, lazy_chains)
        if tailed is None:
            return None
        stream = self._stream_id[start:stop].astype(np.uint64) << np.uint64(32)
        return (np.where(tailed[1], stream ^ self._stream_tag, np.uint64(0)),
                np.where(tailed[1], num_blocks, -1))

    def _tailed(self, start: int, stop: int, num_blocks: np.ndarray,
                lazy_chains: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """(where each request's tail starts, whether it has one), or None without tails. A tail is a request's
        private blocks (its own from ``private_from`` on) and, with ``lazy_chains``, a session's turn's blocks
        past its chain's first (``RequestSpec.chain_from``: past the system prompt), which only a chain
        indexed after all reads."""
        private = self.private_from(start, stop)
        chained = lazy_chains and self._sessions
        if private is None and not chained:
            return None
        floor = np.zeros(stop - start, dtype=np.int64)
        if self._prefix_id is not None:
            floor = np.where(self._prefix_id[start:stop] >= 0, self._prefix_blocks, 0)
        if private is None:
            tail_from = num_blocks
        else:
            tail_from = np.where((private >= floor) & (private < num_blocks), private, num_blocks)
        if chained:
            tail_from = np.minimum(tail_from, floor + 1)
        return tail_from, tail_from < num_blocks

    def _keys(self, start: int, stop: int, num_blocks: np.ndarray,
              first: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The keys of the first ``num_blocks`` blocks of each request (from block ``first[i]`` on, if given)."""
        if first is None:
            offsets, row, position = block_positions(num_blocks)
        else:
            offsets, row, position = block_positions(num_blocks - first)
            position += first[row]
        owner = self._stream_id[start:stop][row]
        tag = np.full(len(row), self._stream_tag, dtype=np.uint64)
        if self._prefix_id is not None:
            prefix = self._prefix_id[start:stop][row]
            shared = (prefix >= 0) & (position < self._prefix_blocks)
            owner = np.where(shared, prefix, owner)
            tag[shared] = self._prefix_tag
        # (owner, position) packed in one word: both stay far below 2**32 (ids count requests or sessions).
        packed = (owner.astype(np.uint64) << np.uint64(32)) | position.astype(np.uint64)
        return mix_into(packed ^ tag), offsets

    def hashes(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys themselves: a key names its stream (or system prompt) and position, and a stream's
        system prompt is fixed, so equal keys already mean equal blocks up to there (no chaining: most of
        the cost of building a request with thousands of prompt tokens)."""
        return self.keys(start, stop)

    def private_from(self, start: int, stop: int) -> np.ndarray | None:
        """A request's own stream is private past its system prompt's blocks. A session's stream is walked
        again by its next turn: only its last turn's new blocks are private (as the generator says)."""
        return None if self._private_from is None else self._private_from[start:stop]

    def split_hashes(self, start: int, stop: int) -> SplitHashes | None:
        """A private block's key names its own stream and position (never the system prompt's, which ends
        before ``private_from``): its hash is ``splitmix64(((stream << 32) | j) ^ tag)``, a tail's rule with
        key ``(stream << 32) ^ tag``. Only the blocks before ``private_from`` are derived here."""
        num_blocks = self._hashed_tokens[start:stop] // self._block_size
        split = self._tailed(start, stop, num_blocks)
        tails = self.tails(start, stop)
        private = self.private_from(start, stop)
        if split is None or tails is None or private is None:
            return None
        values, offsets = self._keys(start, stop, split[0])
        return SplitHashes(values=values, offsets=offsets, private_from=private, tail_key=tails[0],
                           tail_stop=tails[1])


_CHAIN_WINDOW_BLOCKS = 1 << 19
"""Blocks whose chains ``MooncakeBlockKeys.hashes`` derives together when requests are read in order: about
700 requests of Mooncake's conversation trace in 16-token blocks, 4 MB of hashes. Replaying that whole trace
(12,031 requests, compiled): 7.8 -> 4.8 s of CPU, peak RSS 194 -> 225 MB; twice the window ran no faster
and peaked 20 MB higher."""


@dataclass(frozen=True)
class _ChainWindow:
    """Chained hashes of requests [start, stop), back to back; ``offsets`` from 0, one per request and one."""

    start: int
    stop: int
    values: np.ndarray
    offsets: np.ndarray

    def slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Requests [start, stop) (inside the window): their hashes and offsets from 0."""
        offsets = self.offsets[start - self.start : stop - self.start + 1]
        return self.values[int(offsets[0]) : int(offsets[-1])], offsets - offsets[0]


class MooncakeBlockKeys:
    """Mooncake's 512-token block ids mapped onto the engine's block size.

    With block_size <= 512, id h at trace position p becomes 512 / block_size engine blocks keyed
    (h, sub-index); chaining makes each hash depend on every id before it. So two requests whose first k
    ids agree share exactly k * 512 / block_size hashes and differ from the next block on. With a larger
    block size each engine block is keyed by its run of ids. Only blocks full within the (possibly
    truncated) prompt get a hash.
    """

    def __init__(
        self, *, block_size: int, id_values: np.ndarray, id_offsets: np.ndarray, prompt_tokens: np.ndarray
    ) -> None:
        self._block_size = block_size
        self._ids = id_values.astype(np.uint64)
        self._id_offsets = id_offsets
        self._prompt_tokens = prompt_tokens
        self._tag = _namespace_key(0, BlockTag.MOONCAKE)  # trace ids mean the same whatever the seed
        self._block_ends = np.cumsum(self._num_blocks(0, len(prompt_tokens)))
        """Blocks with a hash of requests 0..i, for sizing a ``_ChainWindow``."""
        self._window: _ChainWindow | None = None
        """The hashes last derived (one attribute, read once per call: a racing reader derives again)."""

    def private_from(self, start: int, stop: int) -> np.ndarray | None:
        """None: any two requests may carry the same ids."""
        return None

    @property
    def repeats_session_prefix(self) -> bool:
        """False: a trace's later turn need not repeat every block of an earlier one."""
        return False

    @property
    def prefix_blocks(self) -> int:
        """0: shared prefixes are whatever the trace's ids share, found by the prefix cache itself."""
        return 0

    def prefix_ids(self, start: int, stop: int) -> np.ndarray | None:
        return None

    def prefix_values(self, prompts: list[int]) -> np.ndarray:
        """None to give: ``prefix_blocks`` is 0."""
        return np.zeros(0, dtype=np.uint64)

    def value_counts(self, start: int, stop: int, lazy_chains: bool = False) -> np.ndarray:
        return np.diff(self.keys(start, stop)[1])

    def values_from(self, start: int, stop: int, first: np.ndarray, lazy_chains: bool = False) -> np.ndarray:
        """The chained hashes, every one derived (a chain cannot start in its middle), then cut."""
        values, offsets = self.hashes(start, stop)
        _, row, position = block_positions(np.diff(offsets))
        return values[position >= first[row]]

    def tails(self, start: int, stop: int, lazy_chains: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        return None

    def split_hashes(self, start: int, stop: int) -> SplitHashes | None:
        """None: no block is private."""
        return None

    def hashes(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids chained: an id names one block's content, not what came before it.

        ``chain_hashes`` advances every chain one block per numpy pass, so its cost is the passes (the longest
        request's blocks) more than the blocks: derived for the few dozen requests a spec chunk holds, the
        chains of the whole conversation trace (12,031 requests, 9.0 M blocks of 16 tokens) took 14.4 s, and
        1.1 s 2,000 requests at a time. So where requests are read in order (a call starting where the last
        window ended) the chains of the next ``_CHAIN_WINDOW_BLOCKS`` blocks are derived together and the
        calls inside them sliced from it; any other call derives just its own requests."""
        window = self._window
        if window is not None and window.start <= start and stop <= window.stop:
            return window.slice(start, stop)
        end = stop
        if window is not None and start == window.stop:
            before = int(self._block_ends[start - 1]) if start else 0
            end = int(np.searchsorted(self._block_ends, before + _CHAIN_WINDOW_BLOCKS, side="right"))
            end = min(max(end, stop), len(self._block_ends))
        keys, offsets = self.keys(start, end)
        window = self._window = _ChainWindow(start, end, chain_hashes(keys, offsets), offsets)
        return window.slice(start, stop)

    def _num_blocks(self, start: int, stop: int) -> np.ndarray:
        """Each request's blocks with a hash: those full within its prompt, as far as its ids reach."""
        num_ids = self._id_offsets[start + 1 : stop + 1] - self._id_offsets[start:stop]
        full_blocks = self._prompt_tokens[start:stop] // self._block_size
        if self._block_size <= MOONCAKE_BLOCK_TOKENS:
            return np.minimum(full_blocks, num_ids * (MOONCAKE_BLOCK_TOKENS // self._block_size))
        return np.minimum(full_blocks, num_ids // (self._block_size // MOONCAKE_BLOCK_TOKENS))

    def keys(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        first_id = self._id_offsets[start:stop]
        if self._block_size <= MOONCAKE_BLOCK_TOKENS:
            per_id = MOONCAKE_BLOCK_TOKENS // self._block_size
            offsets, row, position = block_positions(self._num_blocks(start, stop))
            trace_id = self._ids[first_id[row] + position // per_id]
            keys = mix_into(trace_id ^ self._tag)
            keys += (position % per_id).astype(np.uint64)
            return mix_into(keys), offsets
        ids_per_block = self._block_size // MOONCAKE_BLOCK_TOKENS
        offsets, row, position = block_positions(self._num_blocks(start, stop))
        keys = np.full(len(row), self._tag, dtype=np.uint64)
        for sub in range(ids_per_block):
            keys ^= self._ids[first_id[row] + position * ids_per_block + sub]
            mix_into(keys)
        return keys, offsets

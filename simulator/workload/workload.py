"""``Workload``: a request stream as read-only numpy columns sorted by arrival, with block hashes
derived chunk by chunk from its block keys, yielded lazily as ``RequestSpec`` in arrival order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from simulator.core.request import RequestSpec, specs_from_columns
from simulator.workload.block_keys import BlockKeys
from simulator.workload.shared_hashes import SharedHashes, StreamTail

_ITER_CHUNK = 4096
"""At most this many requests have their specs built together while iterating (numpy calls amortised)."""

_CHUNK_BLOCKS = 1 << 15
"""...and about this many blocks of hashes: the Python ints one ``tolist`` makes are then still in the CPU's
caches when they are sliced per request (4096 chat requests at a time, ~400k blocks, built each spec 3x
slower)."""

if TYPE_CHECKING:
    import pandas as pd


class Workload:
    """A request stream as columns, sorted by arrival; request i is the i-th to arrive.

    Columns are read-only numpy arrays. Block hashes are derived from ``block_keys`` on demand (they are
    the bulk of the data), so they cost memory only for the chunk being iterated.
    """

    __slots__ = ("_block_keys", "arrival_s", "block_size", "output_tokens", "prompt_tokens", "session_id")

    def __init__(
        self,
        *,
        arrival_s: np.ndarray,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        block_size: int,
        session_id: np.ndarray | None = None,
        block_keys: BlockKeys | None = None,
    ) -> None:
        size = len(arrival_s)
        self.arrival_s = _frozen(arrival_s, np.float64)
        """Arrival time of each request, seconds from the start of the run, ascending."""
        self.prompt_tokens = _frozen(prompt_tokens, np.int64)
        """Prompt length of each request, tokens (>= 1)."""
        self.output_tokens = _frozen(output_tokens, np.int64)
        """Tokens each request generates (>= 1)."""
        self.session_id = _frozen(session_id if session_id is not None else np.full(size, -1), np.int64)
        """Session of each request; -1 for none (``RequestSpec.session_id`` is then None)."""
        self.block_size = block_size
        """Tokens per KV block the hashes were computed for."""
        self._block_keys = block_keys
        if not len(self.prompt_tokens) == len(self.output_tokens) == len(self.session_id) == size:
            raise ValueError("workload columns must have equal lengths")
        if size and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise ValueError("arrival_s must be non-negative and ascending")
        if size and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("prompt_tokens and output_tokens must be >= 1")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __iter__(self) -> Iterator[RequestSpec]:
        """RequestSpecs in arrival order, built chunk by chunk so memory stays flat."""
        return self.iter_specs()

    def iter_specs(self, *, block_hashes: bool = True, lazy_chains: bool = False) -> Iterator[RequestSpec]:
        """RequestSpecs in arrival order; ``block_hashes=False`` leaves their hashes empty, for a fleet
        in which nothing reads them (no replica caches prefixes): deriving them is most of the cost of
        building a spec. ``lazy_chains``: a session's turn holds its hashes as values only to its chain's
        first block (``RequestSpec.chain_from``), the rest as a tail derived on first use (``RequestSpec``),
        for a fleet whose KV managers hand chains from turn to turn (most turns never read the rest)."""
        keys = self._block_keys
        # Hashes that requests share (a session's earlier turns, a system prompt) as the same int objects.
        shared = (SharedHashes() if block_hashes and keys is not None
                  and (keys.repeats_session_prefix or keys.prefix_blocks) else None)
        chunks = (self._chunk(start, stop, block_hashes=block_hashes, shared=shared, lazy_chains=lazy_chains)
                  for start, stop in itertools.pairwise(self._chunk_bounds(block_hashes)))
        return itertools.chain.from_iterable(chunks)  # the next spec is a C-level step, not a generator's

    def _chunk_bounds(self, block_hashes: bool) -> Iterator[int]:
        """First request of each chunk, then the end: at most ``_ITER_CHUNK`` requests, and about
        ``_CHUNK_BLOCKS`` blocks whose hashes are derived as values (at least one request) when hashes are
        built."""
        size = len(self)
        yield 0
        if not block_hashes or self._block_keys is None:
            yield from range(min(_ITER_CHUNK, size), size, _ITER_CHUNK)
            if size:
                yield size
            return
        per_request = (self.prompt_tokens + self.output_tokens) // self.block_size
        private = self._block_keys.private_from(0, size)
        if private is not None:  # blocks past private_from are tails: derived later, if ever (RequestSpec)
            per_request = np.where(private >= 0, np.minimum(private, per_request), per_request)
        blocks = np.cumsum(per_request)
        start = 0
        while start < size:
            reached = int(blocks[start - 1]) if start else 0
            stop = int(np.searchsorted(blocks, reached + _CHUNK_BLOCKS, side="right"))
            start = min(max(stop, start + 1), start + _ITER_CHUNK, size)
            yield start

    def specs(self) -> list[RequestSpec]:
        """Every request as a RequestSpec (convenient for small workloads and tests)."""
        return list(self)

    def with_arrivals(self, arrival_s: np.ndarray) -> Workload:
        """The same requests (lengths, sessions, block keys) arriving at ``arrival_s`` instead: a
        workload replayed against a real server is simulated at the times its requests were sent."""
        return Workload(arrival_s=np.asarray(arrival_s, dtype=np.float64), prompt_tokens=self.prompt_tokens,
                        output_tokens=self.output_tokens, block_size=self.block_size, session_id=self.session_id,
                        block_keys=self._block_keys)

    def block_hashes(self, index: int) -> tuple[int, ...]:
        """The chained block hashes of request ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._hashes(index, index + 1)[0]

    def to_pandas(self) -> pd.DataFrame:
        """One row per request: request_id, arrival_s, prompt_tokens, output_tokens, session_id (<NA>
        for none)."""
        import pandas as pd  # not at import: simulating never builds a frame

        return pd.DataFrame(
            {
                "request_id": np.arange(len(self), dtype=np.int64),
                "arrival_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "session_id": pd.Series(self.session_id, dtype="Int64").mask(self.session_id < 0),
            }
        )

    def _hashes(self, start: int, stop: int) -> list[tuple[int, ...]]:
        if self._block_keys is None:
            return [()] * (stop - start)
        return _tuples(*self._block_keys.hashes(start, stop))

    def _chunk(self, start: int, stop: int, *, block_hashes: bool = True,
               shared: SharedHashes | None = None, lazy_chains: bool = False) -> list[RequestSpec]:
        """Specs of requests [start, stop); ``shared``: the hashes earlier chunks made that these share."""
        columns = (
            start,
            self.arrival_s[start:stop].tolist(),
            self.prompt_tokens[start:stop].tolist(),
            self.output_tokens[start:stop].tolist(),
            self.session_id[start:stop].tolist(),
        )
        keys = self._block_keys if block_hashes else None
        if keys is None:
            return specs_from_columns(*columns, [()] * (stop - start))
        if shared is not None:
            return self._shared_chunk(shared, keys, start, stop, columns, lazy_chains)
        split = keys.split_hashes(start, stop)
        chain = _chain_from(keys, start, stop)
        if split is None:
            private = keys.private_from(start, stop)
            return specs_from_columns(*columns, self._hashes(start, stop),
                                      None if private is None else private.tolist(), chain_from=chain)
        # Private blocks as tails (derived only if something reads them: most requests finish first).
        return specs_from_columns(*columns, _tuples(split.values, split.offsets), split.private_from.tolist(),
                                  split.tail_key.tolist(), split.tail_stop.tolist(), chain, tail_rule=StreamTail)

    @staticmethod
    def _shared_chunk(shared: SharedHashes, keys: BlockKeys, start: int, stop: int,
                      columns: tuple[int, list[float], list[int], list[int], list[int]],
                      lazy_chains: bool) -> list[RequestSpec]:
        """``_chunk`` deriving only the hashes no earlier request made (``SharedHashes``): a session's last
        turn is the one whose own blocks are private (the generator marks only those)."""
        private = keys.private_from(start, stop)
        last = [False] * (stop - start) if private is None else (private >= 0).tolist()
        chain = _chain_from(keys, start, stop)
        lazy_chains = lazy_chains and chain is not None  # a tail past a chain's first block needs the chain
        tuples = shared.tuples(keys.value_counts(start, stop, lazy_chains),
                               lambda first: keys.values_from(start, stop, first, lazy_chains),
                               session_id=columns[4] if keys.repeats_session_prefix else None, last=last,
                               prefix_id=keys.prefix_ids(start, stop), prefix_blocks=keys.prefix_blocks,
                               prefix_values=keys.prefix_values)
        tails = keys.tails(start, stop, lazy_chains)
        private_list = None if private is None else private.tolist()
        if tails is None:
            return specs_from_columns(*columns, tuples, private_list, chain_from=chain)
        return specs_from_columns(*columns, tuples, private_list, tails[0].tolist(), tails[1].tolist(), chain,
                                  tail_rule=StreamTail)


def _chain_from(keys: BlockKeys, start: int, stop: int) -> list[int] | None:
    """Each request's ``chain_from``: a session's turns carry their session's hashes past the system prompt
    (``repeats_session_prefix``), a later turn the earlier ones' first; None for other keys."""
    if not keys.repeats_session_prefix:
        return None
    prefix = keys.prefix_ids(start, stop)
    if prefix is None:
        return [0] * (stop - start)
    return np.where(prefix >= 0, keys.prefix_blocks, 0).tolist()


def _tuples(values: np.ndarray, offsets: np.ndarray) -> list[tuple[int, ...]]:
    """Each request's hashes as a tuple of Python ints (as RequestSpec declares), from values back to back."""
    hashes = values.tolist()
    return [tuple(hashes[a:b]) for a, b in itertools.pairwise(offsets.tolist())]


def _frozen(values: np.ndarray, dtype: type[np.generic]) -> np.ndarray:
    array = np.array(values, dtype=dtype)  # a copy: the caller's array stays theirs
    array.flags.writeable = False
    return array

"""``SharedHashes``: requests' block-hash tuples whose common parts are the very same int objects.

A session's turn repeats its previous turn's hashes as its first ones, and requests with one system prompt
share that prompt's blocks (``BlockKeys.repeats_session_prefix``, ``BlockKeys.prefix_blocks``). Built
request by request from numpy, each would hold equal ints of its own: here a turn's tuple starts with its
session's previous tuple, and a first turn (or a request outside sessions) with its system prompt's, and
only the other hashes become Python ints. Fewer ints are made, and a prefix-cache lookup meets the very
keys the cache's index holds (an identity hit: no comparison of two equal ints, no read of a second object).
The values are the same as ``Workload``'s plain path makes (a test compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.core.request import HashTail
from simulator.workload.block_keys import mix_into


class StreamTail(HashTail):
    """A ``HashTail`` derived in one numpy pass: a session's tail is about a hundred blocks, which
    ``splitmix64`` on Python ints (each product a big int) makes two orders of magnitude slower. The same
    values, bit for bit (the workload's keys are that very function)."""

    def values(self) -> tuple[int, ...]:
        keys = np.arange(self.start, self.stop, dtype=np.uint64)
        keys ^= np.uint64(self.key)
        hashes: list[Any] = mix_into(keys).tolist()
        return tuple(hashes)


class SharedHashes:
    """Each open session's latest tuple and each system prompt's, across the chunks of one pass over a
    workload (``Workload.iter_specs``)."""

    __slots__ = ("_prefixes", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[int, tuple[int, ...]] = {}
        """Session -> its latest turn's hashes, until its last turn."""
        self._prefixes: dict[int, tuple[int, ...]] = {}
        """System prompt -> the hashes of its blocks."""

    @property
    def num_open_sessions(self) -> int:
        return len(self._sessions)

    def tuples(self, counts: np.ndarray, values_from: Callable[[np.ndarray], np.ndarray], *,
               session_id: list[int] | None, last: list[bool], prefix_id: np.ndarray | None, prefix_blocks: int,
               prefix_values: Callable[[list[int]], np.ndarray]) -> list[tuple[int, ...]]:
        """Request i's ``counts[i]`` hashes as a tuple. ``values_from(first)``: the hashes of each request from
        its block ``first[i]`` on, back to back (``BlockKeys.values_from``): only those are derived and made
        ints. ``session_id``: each request's session (< 0: none), or None when turns do not repeat their
        previous turn's hashes; ``last``: whether it is its session's last turn (its session's tuple is
        dropped then); ``prefix_id``: each request's system prompt (< 0: none), whose first
        ``prefix_blocks`` hashes all its requests share (None: none), ``prefix_values(prompts)`` those hashes
        of each prompt, back to back (``BlockKeys.prefix_values``)."""
        lengths: list[int] = counts.tolist()
        n = len(lengths)
        prefixes = self._prefixes
        prompts: list[int] = prefix_id.tolist() if prefix_id is not None and prefix_blocks > 0 else [-1] * n
        unknown = sorted({p for p in prompts if p >= 0 and p not in prefixes})
        if unknown:
            known = prefix_values(unknown).tolist()
            for k, prompt in enumerate(unknown):
                prefixes[prompt] = tuple(known[k * prefix_blocks:(k + 1) * prefix_blocks])
        sessions = self._sessions
        # How many hashes each request takes from its session's previous turn (in this chunk or before) or
        # else from its system prompt, and which (True: the session's).
        reused = [0] * n
        from_session = [False] * n
        seen: dict[int, int] = {}  # the latest length of each session met in this chunk (0 once it ended)
        for i in range(n):
            length = lengths[i]
            session = session_id[i] if session_id is not None else -1
            if session >= 0:
                previous = seen.get(session)
                if previous is None:
                    earlier = sessions.get(session)
                    previous = len(earlier) if earlier is not None else 0
                seen[session] = 0 if last[i] else length
                if previous:
                    reused[i] = min(previous, length)
                    from_session[i] = True
                    continue
            prompt = prompts[i]
            if prompt >= 0 and prompt in prefixes:
                reused[i] = min(prefix_blocks, length)
        # Hashes typed as objects: compiled, they go from list to tuple as they are (no unboxing and re-boxing).
        new: list[Any] = values_from(np.asarray(reused, dtype=np.int64)).tolist()
        tuples: list[tuple[int, ...]] = []
        at = 0
        for i in range(n):
            take = reused[i]
            end = at + lengths[i] - take
            fresh: tuple[Any, ...] = tuple(new[at:end])
            at = end
            session = session_id[i] if session_id is not None else -1
            if take:
                source = sessions[session] if from_session[i] else prefixes[prompts[i]]
                head = source if take == len(source) else source[:take]
                hashes = head + fresh if fresh else head
            else:
                hashes = fresh
            tuples.append(hashes)
            if session >= 0:
                if last[i]:
                    sessions.pop(session, None)
                else:
                    sessions[session] = hashes
        return tuples

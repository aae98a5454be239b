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

import numpy as np


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

    def tuples(self, values: np.ndarray, offsets: np.ndarray, *, session_id: list[int] | None, last: list[bool],
               prefix_id: np.ndarray | None, prefix_blocks: int) -> list[tuple[int, ...]]:
        """Request i's hashes are ``values[offsets[i]:offsets[i + 1]]``, as a tuple. ``session_id``: each
        request's session (< 0: none), or None when turns do not repeat their previous turn's hashes;
        ``last``: whether it is its session's last turn (its session's tuple is dropped then);
        ``prefix_id``: each request's system prompt (< 0: none), whose first ``prefix_blocks`` hashes all
        its requests share (None: none)."""
        bounds = offsets.tolist()
        n = len(bounds) - 1
        prefixes = self._prefixes
        prompts: list[int] = [-1] * n
        if prefix_id is not None and prefix_blocks > 0:
            prompts = prefix_id.tolist()
            self._learn_prefixes(values, bounds, prompts, prefix_blocks)
        sessions = self._sessions
        # How many hashes each request takes from its session's previous turn (in this chunk or before) or
        # else from its system prompt, and which (True: the session's).
        reused = [0] * n
        from_session = [False] * n
        seen: dict[int, int] = {}  # the latest length of each session met in this chunk (0 once it ended)
        for i in range(n):
            length = bounds[i + 1] - bounds[i]
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
        starts = offsets[:-1] + np.asarray(reused, dtype=np.int64)
        lengths = offsets[1:] - starts
        new_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        # Positions of the hashes still to make, request after request: each request's run, back to back.
        positions = np.arange(int(new_offsets[-1]), dtype=np.int64) + np.repeat(starts - new_offsets[:-1], lengths)
        new = values[positions].tolist()
        new_bounds = new_offsets.tolist()
        tuples: list[tuple[int, ...]] = []
        for i in range(n):
            fresh = tuple(new[new_bounds[i]:new_bounds[i + 1]])
            take = reused[i]
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

    def _learn_prefixes(self, values: np.ndarray, bounds: list[int], prompts: list[int], prefix_blocks: int) -> None:
        """The hashes of each system prompt met here for the first time, from a request that holds them all."""
        prefixes = self._prefixes
        for i, prompt in enumerate(prompts):
            if prompt >= 0 and prompt not in prefixes and bounds[i + 1] - bounds[i] >= prefix_blocks:
                prefixes[prompt] = tuple(values[bounds[i]:bounds[i] + prefix_blocks].tolist())

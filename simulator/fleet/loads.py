"""The fleet's load list, as the least-loaded routing policies read it: ``loads[i]`` is replica i's request
count, kept equal to it by the replica (``Replica.loads``, a ``LoadLevels``), and the pick is the first
minimum. ``LoadLevels`` also counts the replicas at each load, so the smallest load of the fleet is known
and a pick's scan stops at the first replica holding it rather than reading every replica.

On the per-request path (every least-loaded choice scans replicas), so ``fleetsim build-native`` compiles
it: one native loop over the list instead of ``min`` and ``index`` comparing Python ints. Standard library
only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

_COMPILED: Final = not __file__.endswith(".py")
"""This module runs as the compiled build, not as its source."""


class LoadLevels:
    """The fleet's load list (``values``: index = replica id, what the routers read) and how many replicas
    stand at each load, so that ``lowest`` is always the smallest load in it. The replicas write their
    loads through ``set``; a dynamic fleet's new replica joins at load 0 (``append``). Loads move by one
    request at a time, so keeping ``lowest`` is a step or two per change."""

    __slots__ = ("_counts", "lowest", "total", "values")

    def __init__(self, size: int) -> None:
        self.values: list[int] = [0] * size
        self._counts: list[int] = [size]
        """Replicas at each load (index = load)."""
        self.lowest: i64 = 0
        """``min(values)`` (0 while there are none)."""
        self.total: i64 = 0
        """``sum(values)``: the fleet's requests (session affinity's capacity reads it per request)."""

    def append(self) -> None:
        """A new replica, at load 0."""
        self.values.append(0)
        counts = self._counts
        counts[0] = counts[0] + 1  # not ``+= 1``: compiled, an augmented item assignment is a generic add
        self.lowest = 0

    def set(self, index: int, value: int) -> None:
        """Replica ``index`` now holds ``value`` requests (>= 0)."""
        values = self.values
        old: i64 = values[index]
        new: i64 = value
        if new == old:
            return
        if new < 0:
            raise ValueError(f"a load must be >= 0, got {value}")
        values[index] = value
        self.total += new - old
        counts = self._counts
        counts[old] = counts[old] - 1
        while len(counts) <= new:
            counts.append(0)
        counts[new] = counts[new] + 1
        lowest: i64 = self.lowest
        if new < lowest:
            self.lowest = new
        elif old == lowest and counts[old] == 0:
            while counts[lowest] == 0:  # ends at ``new`` at the latest: it is above ``old`` and counted
                lowest += 1
            self.lowest = lowest


def least_loaded_index(loads: list[int], floor: int = 0) -> int:
    """Index of the first smallest load (ties to the lowest replica id); ``loads`` must not be empty.
    ``floor``: a load no replica is below (``LoadLevels.lowest``: the scan stops at the first replica
    there)."""
    if not loads:
        raise ValueError("no replicas to route to")
    if _COMPILED:
        return first_min_index(loads, floor)
    return loads.index(min(loads))  # interpreted, two C-level scans beat a Python loop


def first_min_index(values: list[int], floor: int = 0) -> int:
    """Index of the first smallest of ``values`` (not empty, none below ``floor``: request counts), in one
    loop over machine integers that stops at the first value at the floor (no load is smaller: with the
    fleet's smallest load as the floor, the scan ends at the first replica holding it)."""
    best: i64 = 0
    lowest: i64 = values[0]
    count: i64 = len(values)
    bottom: i64 = floor
    i: i64 = 1
    while i < count and lowest > bottom:
        value: i64 = values[i]
        if value < lowest:
            lowest = value
            best = i
        i += 1
    return best


def least_loaded_of(loads: list[int], ids: list[int], floor: int = 0) -> int:
    """The id in ``ids`` (not empty) whose load is smallest, the first listed on ties: ``min(ids,
    key=loads.__getitem__)``, in one native loop compiled (a dynamic fleet's ready replicas, where ``loads``
    also holds replicas stopped or still starting). ``floor``: a load no replica is below."""
    if not _COMPILED:
        return min(ids, key=loads.__getitem__)  # interpreted, the C-level scan beats a Python loop
    return first_min_of(loads, ids, floor)


def first_min_of(loads: list[int], ids: list[int], floor: int = 0) -> int:
    """The first id in ``ids`` (not empty) of smallest load (none below ``floor``: request counts), in one
    loop over machine integers that stops at the first load at the floor (see ``first_min_index``; with the
    whole fleet's smallest load as the floor, a ready replica holding it ends the scan, and when none does
    the scan reads every id)."""
    best: i64 = ids[0]
    lowest: i64 = loads[best]
    count: i64 = len(ids)
    bottom: i64 = floor
    i: i64 = 1
    while i < count and lowest > bottom:
        replica_id: i64 = ids[i]
        value: i64 = loads[replica_id]
        if value < lowest:
            lowest = value
            best = replica_id
        i += 1
    return best


class LeastLoadedRoute:
    """A least-loaded policy's ``route(spec, now_s)`` on live views: the first smallest of the fleet's load
    list (``least_loaded_index``). One native call per request in the compiled build, where the router's
    ``choose`` behind ``RouterState.route`` is three interpreted calls."""

    __slots__ = ("levels",)

    def __init__(self, levels: LoadLevels) -> None:
        if not levels.values:
            raise ValueError("no replicas to route to")
        self.levels = levels

    def __call__(self, spec: object, now_s: float) -> int:
        levels = self.levels
        return least_loaded_index(levels.values, levels.lowest)

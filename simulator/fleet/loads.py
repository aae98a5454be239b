"""The fleet's load list, as the least-loaded routing policies read it: ``loads[i]`` is replica i's request
count, kept equal to it by the replica (``Replica.loads``), and the pick is the first minimum.

On the per-request path (every least-loaded choice scans every replica), so ``fleetsim build-native``
compiles it: one native loop over the list instead of ``min`` and ``index`` comparing Python ints.
Standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

_COMPILED: Final = not __file__.endswith(".py")
"""This module runs as the compiled build, not as its source."""


def least_loaded_index(loads: list[int]) -> int:
    """Index of the first smallest load (ties to the lowest replica id); ``loads`` must not be empty."""
    if not loads:
        raise ValueError("no replicas to route to")
    if _COMPILED:
        return first_min_index(loads)
    return loads.index(min(loads))  # interpreted, two C-level scans beat a Python loop


def first_min_index(values: list[int]) -> int:
    """Index of the first smallest of ``values`` (not empty, none negative: request counts), in one loop over
    machine integers that stops at the first zero (no load is smaller: in a fleet with idle replicas the
    scan ends at the first of them)."""
    best: i64 = 0
    lowest: i64 = values[0]
    count: i64 = len(values)
    i: i64 = 1
    while i < count and lowest:
        value: i64 = values[i]
        if value < lowest:
            lowest = value
            best = i
        i += 1
    return best


def least_loaded_of(loads: list[int], ids: list[int]) -> int:
    """The id in ``ids`` (not empty) whose load is smallest, the first listed on ties: ``min(ids,
    key=loads.__getitem__)``, in one native loop compiled (a dynamic fleet's ready replicas, where ``loads``
    also holds replicas stopped or still starting)."""
    if not _COMPILED:
        return min(ids, key=loads.__getitem__)  # interpreted, the C-level scan beats a Python loop
    return first_min_of(loads, ids)


def first_min_of(loads: list[int], ids: list[int]) -> int:
    """The first id in ``ids`` (not empty) of smallest load (none negative: request counts), in one loop over
    machine integers that stops at the first zero (see ``first_min_index``)."""
    best: i64 = ids[0]
    lowest: i64 = loads[best]
    count: i64 = len(ids)
    i: i64 = 1
    while i < count and lowest:
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

    __slots__ = ("loads",)

    def __init__(self, loads: list[int]) -> None:
        if not loads:
            raise ValueError("no replicas to route to")
        self.loads = loads

    def __call__(self, spec: object, now_s: float) -> int:
        return least_loaded_index(self.loads)

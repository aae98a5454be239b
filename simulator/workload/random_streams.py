"""Random streams of workload generation: one independent, seeded stream per component, so that
changing one component (adding sessions, say) never moves another's draws."""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """One independent random stream per component: changing one never moves the others' draws."""

    ARRIVAL = 1
    PROMPT = 2
    OUTPUT = 3
    SYSTEM_PROMPT = 4
    TURNS = 5
    THINK = 6
    PROBE = 7
    """Only sizes a first guess; never shapes a request."""


def rng(seed: int, stream: Stream) -> np.random.Generator:
    return np.random.default_rng([int(stream), seed])

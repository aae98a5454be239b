"""Workload: the request stream a fleet serves. Arrival processes, length distributions, sessions with
shared system prompts, block-hash keys for the prefix cache, and replays of public traces, all turned into
one columnar ``Workload`` (``RequestSpec`` rows on demand) by a seeded, reproducible ``generate``.

May import ``simulator.core`` and the foundation modules (``errors``, ``yaml_text``) only.
"""

"""Core: the serving core shared by the real engine and the simulator — request state, block pool and
prefix cache, KV manager, scheduler, engine presets, the step plan, the decode-run fast path. The only
place a batching, paging, preemption or prefix-cache policy exists.

Standard library only: imports nothing of fleetsim outside itself, and never simpy, torch, yaml or I/O.
"""

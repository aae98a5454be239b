"""Fleet: replicas on one SimPy clock. A ``Replica`` runs the shared core's scheduler and advances the
clock by the cost model; the arrival feed routes each request as it arrives; routers pick a replica
(policies registered by name); ``fleet.run_fleet`` wires a workload, a router and the replicas on one
clock and returns what the clock left. It knows nothing of scenario files (``simulator.simulation`` does).

May import ``core``, ``cost``, ``workload``, ``results`` and the foundation modules; nothing above them.
"""

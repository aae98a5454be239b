"""Planning: questions asked of many runs. ``plan`` searches the fewest replicas meeting an SLO, the
saturation knee and the cost-model sensitivity; ``sweep`` runs a grid of scenarios × seeds on a local pool
or Ray and merges the table.

May import everything below it (``scenario``, ``fleet`` and the packages under them); never ``cli``.
"""

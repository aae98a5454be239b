"""Planning: questions asked of many runs. ``plan`` searches the fewest replicas meeting an SLO, the
saturation knee and the cost-model sensitivity; ``sweep`` runs a grid of scenarios × seeds on a local pool
or Ray and merges the table.

May import everything below it (``scenario``, ``fleet`` and the packages under them); never ``cli``.
"""

DEFAULT_SEEDS = 2
"""Seeds per point: two show the seeds' range (too few for a confidence interval, and the verdict says when
the answer is within it) at one simulation per core on a 2-core machine; three, which give a bootstrap
interval, would take two rounds there. Defined here, not in
``plan``, so the command line can show it without importing the planner (and pandas) at start-up."""

"""Cost models from published GPU measurements (Vidur's per-operator and collective profiles).

``vidur`` reads and checks the files; ``kernels`` fits a per-GPU model of GEMM and elementwise kernel
times that transfers to model shapes the data does not hold; ``collectives`` turns the all-reduce files
into curves; ``attention`` scales the one attention profile to other shapes; ``steps`` composes whole-model
step timings from all of them; ``from_published`` fits a profile to those steps. Torch-free: this runs on
any machine.
"""

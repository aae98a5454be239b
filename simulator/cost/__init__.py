"""Cost: what a step costs. ``profile`` is the schema of a calibration profile (coefficients, KV capacity,
provenance) and the accelerator datasheet it may be derived from; ``cost_model`` evaluates a profile on a
step plan's shape (the only thing it may look at) and walks a decode run's step end times.

May import ``simulator.core`` and the foundation modules (``errors``, ``yaml_text``) only.
"""

"""Results: what a run recorded and what it means. The per-request log and per-replica series (written on
the hot path as numpy columns), the summary with SLO attainment and cost, confidence intervals over
seeds, the ``RunResult`` of a scenario's variants as DataFrames, and the HTML report and run folder that
read them. Results are data; the report reads them and nothing here imports the report but the saver.

May import ``simulator.core`` and the foundation modules (``errors``, ``yaml_text``) only.
"""

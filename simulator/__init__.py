"""fleetsim's simulator: a discrete-event model of an LLM inference fleet.

The notebook API is ``simulator.api`` (``load_scenario``, ``run``, ``plan``, ``sweep``, results as
DataFrames). This package file imports nothing, so that ``simulator.core`` (which the real engine
imports) pulls in nothing but the standard library.
"""

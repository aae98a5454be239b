"""fleetsim's simulator: a discrete-event model of an LLM inference fleet.

The notebook API is ``simulator.api`` (``load_scenario``, ``run``, ``plan``, ``sweep``, results as
DataFrames). This package file imports only the standard library, so that ``simulator.core`` (which the
real engine imports) pulls in nothing else; it does one thing: if ``fleetsim build-native`` has compiled
the hot modules for exactly the sources on disk, they are loaded compiled (``simulator.native``).
"""

from simulator import native as _native

_native.install()

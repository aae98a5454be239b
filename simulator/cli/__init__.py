"""The ``fleetsim`` command line: ``main`` parses and dispatches, one module per command family. Every
failure a user can cause is one line on stderr and exit status 2.

Sits on top: may import any part of ``simulator``; ``calibration`` only through its registered plugin.
"""

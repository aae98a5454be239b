"""``fleetsim serve``: the real engine behind an OpenAI-compatible streaming HTTP API (the ``serve`` extra).

``tokens`` (the stated text ↔ id mapping), ``protocol`` (request and chunk bodies, errors), ``loop`` (the
engine's thread and the hand-offs to the event loop), ``app`` (the FastAPI routes), ``server`` (building
it all and running uvicorn). The scheduling is the engine's, which is the shared core's: nothing here
decides anything about batching or KV.
"""

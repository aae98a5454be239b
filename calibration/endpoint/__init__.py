"""Client side of serving: drive any OpenAI-compatible endpoint (``fleetsim bench``), and validate or fit a
profile from what its client sees (``fleetsim validate --endpoint``, ``fleetsim calibrate --endpoint``).
Never imports torch: it measures a server, it does not run one."""

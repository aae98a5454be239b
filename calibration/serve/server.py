"""``fleetsim serve``: the real engine behind the OpenAI-compatible app, on uvicorn.

Builds the engine (a catalogue model with random weights, ``calibration/engine``), its scheduler
configuration (from the options, or a scenario's engine section so a simulation of that scenario runs the
very same policy), the serving loop and the app, and runs them. Listens on 127.0.0.1 unless told
otherwise. ``ServerThread`` runs the same server on a thread of the calling process (tests, benchmarks).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.core.config import SchedulerConfig
from simulator.errors import ConfigError

DEFAULT_CPU_KV_GIB = 0.25
"""The CPU KV pool of the shipped CPU profile (``fleetsim calibrate``'s default budget)."""
GPU_MEMORY_FRACTION = 0.9
"""On a GPU without ``--kv-gib``: this share of free memory, less the weights, for the KV pool (vLLM's
``gpu_memory_utilization`` default)."""
EOS_TOKEN_ID = 0
"""The engine's end-of-sequence id: a request without ``ignore_eos`` stops when the model samples it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """How ``fleetsim serve`` builds and exposes its engine."""

    model: str
    """Catalogue model (``calibration/engine/configs.py``): tiny, small, llama-3-8b..."""
    device: str = "cpu"
    host: str = "127.0.0.1"
    """Loopback by default: the server has no authentication."""
    port: int = 8000
    dtype: str | None = None
    """float32 on CPU, bfloat16 on a GPU when not given."""
    backend: str | None = None
    """Attention backend: sdpa_gather on CPU, triton_paged on a GPU when not given."""
    kv_gib: float | None = None
    """KV pool budget in GiB; None: 0.25 on CPU, 90 % of free GPU memory less the weights on a GPU."""
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    """Token budget of one step: a CPU step of 512 tokens of the small model takes about a quarter second."""
    block_size: int = 16
    prefix_caching: bool = True
    max_model_len: int | None = None
    """Longest prompt plus output; None = the model's position limit."""
    scenario: Path | None = None
    """Take the scheduler configuration (batching, limits, KV pool) from this scenario's engine section and
    profile instead of the options above."""
    threads: int | None = 1
    """torch CPU threads (1: as the shipped CPU profile was measured)."""
    seed: int = 0
    log_dir: Path | None = None
    """Write ``steps.csv`` and ``requests.jsonl`` (the engine's own timings) here while serving."""


def _torch_dtype(options: ServeOptions) -> Any:
    import torch

    name = options.dtype or ("bfloat16" if options.device.startswith("cuda") else "float32")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ConfigError(f"unknown dtype {name!r}; choose one of {', '.join(dtypes)}", field="dtype")
    return dtypes[name]


def scheduler_config(options: ServeOptions) -> SchedulerConfig:
    """The scheduler's configuration: a scenario's (one replica of it) or built from the options."""
    if options.scenario is not None:
        from simulator.scenario import load_scenario, resolve_replica

        return resolve_replica(load_scenario(options.scenario).scenario).scheduler
    from calibration.engine.configs import get_model
    from calibration.engine.kv_cache import kv_budget_bytes, num_blocks_for_budget

    shape = get_model(options.model)
    dtype = _torch_dtype(options)
    if options.kv_gib is not None:
        budget = int(options.kv_gib * 2**30)
    elif options.device.startswith("cuda"):
        weights = shape.num_params * dtype.itemsize
        budget = kv_budget_bytes(options.device, memory_fraction=GPU_MEMORY_FRACTION) - weights
    else:
        budget = int(DEFAULT_CPU_KV_GIB * 2**30)
    num_blocks = num_blocks_for_budget(shape, options.block_size, dtype, max(budget, 0))
    if num_blocks < 1:
        raise ConfigError(f"a KV budget of {budget / 2**30:.3g} GiB holds no block of {options.model}", field="kv_gib")
    try:
        return SchedulerConfig(
            num_blocks=num_blocks, block_size=options.block_size, max_num_seqs=options.max_num_seqs,
            max_num_batched_tokens=options.max_num_batched_tokens, enable_prefix_caching=options.prefix_caching,
            max_model_len=options.max_model_len or shape.max_position,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build_engine(options: ServeOptions, config: SchedulerConfig) -> Any:
    """The real engine, warmed up (first-call costs paid before the first request)."""
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine

    if options.threads and not options.device.startswith("cuda"):
        torch.set_num_threads(options.threads)
    cuda = options.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device", field="device")
    engine = Engine(get_model(options.model), config, device=options.device, dtype=_torch_dtype(options),
                    backend=options.backend or ("triton_paged" if cuda else "sdpa_gather"), seed=options.seed,
                    eos_token_id=EOS_TOKEN_ID)
    warm_up(engine.runner, max_batch=min(8, config.max_num_seqs))
    return engine


def warm_up(runner: Any, *, max_batch: int) -> None:
    """A prompt and a decode batch straight on the runner, on scratch blocks no request holds (the
    scheduler never sees them: its counters and prefix cache stay untouched)."""
    from calibration.engine.attention import ScheduledSeq

    block_size = runner.block_size
    batch = max(1, min(max_batch, runner.num_blocks))
    prompt = block_size
    for _ in range(2):
        runner.execute([ScheduledSeq(num_new_tokens=prompt, num_computed_tokens=0, block_table=(0,))], [1] * prompt)
        seqs = [ScheduledSeq(num_new_tokens=1, num_computed_tokens=prompt - 1, block_table=(i,)) for i in range(batch)]
        runner.execute(seqs, [1] * batch)


def build_app_for(options: ServeOptions) -> tuple[Any, Any]:
    """(app, loop) for ``options``: the engine built, nothing started (the app's lifespan starts the loop)."""
    from calibration.engine.configs import get_model
    from calibration.serve.app import ServedModel, build_app
    from calibration.serve.loop import EngineLoop

    try:
        shape = get_model(options.model)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(err).strip("\"'"), field="model") from None
    config = scheduler_config(options)
    engine = build_engine(options, config)
    loop = EngineLoop(engine, log_dir=options.log_dir)
    served = ServedModel(name=options.model, max_model_len=config.max_model_len, vocab_size=shape.vocab_size)
    return build_app(loop, served), loop


def _uvicorn_config(app: Any, options: ServeOptions) -> Any:
    import uvicorn

    return uvicorn.Config(app, host=options.host, port=options.port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=5)


def serve(options: ServeOptions) -> None:
    """Build everything and serve until interrupted."""
    import uvicorn

    app, loop = build_app_for(options)
    config = loop.engine.config
    print(f"fleetsim serve: {options.model} on {options.device}, http://{options.host}:{options.port}/v1 "
          f"(max_num_seqs {config.max_num_seqs}, max_num_batched_tokens {config.max_num_batched_tokens}, "
          f"{config.num_blocks} KV blocks of {config.block_size}, prefix caching "
          f"{'on' if config.prefix_caching else 'off'}, max_model_len {config.max_model_len})", flush=True)
    uvicorn.Server(_uvicorn_config(app, options)).run()


class AppThread:
    """An ASGI app on uvicorn on a thread of this process, on a free port of ``host``: ``with AppThread(app) as
    s: s.url``. Stops on exit."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", start_timeout_s: float = 60.0,
                 name: str = "fleetsim-app") -> None:
        import uvicorn

        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                     access_log=False, timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name=name,
                                        daemon=True)
        self._start_timeout_s = start_timeout_s

    def __enter__(self) -> AppThread:
        import time

        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._socket.close()


class ServerThread(AppThread):
    """fleetsim serve on a thread of this process, on a free loopback port: ``with ServerThread(opts) as s:
    s.url``. Stops (aborting what is in flight) on exit."""

    def __init__(self, options: ServeOptions, *, start_timeout_s: float = 60.0) -> None:
        app, self.loop = build_app_for(options)
        super().__init__(app, host=options.host, start_timeout_s=start_timeout_s, name="fleetsim-serve")

    def __enter__(self) -> ServerThread:
        super().__enter__()
        return self

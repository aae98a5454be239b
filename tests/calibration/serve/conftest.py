"""One tiny-model server per test module, on a free loopback port of this process (skipped without the
serve and engine extras)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from calibration.serve.server import ServeOptions, ServerThread

TINY = ServeOptions(model="tiny", kv_gib=0.004, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024)
"""A pool of 524 blocks of 16 tokens, small enough for a test to fill."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(TINY) as running:
        yield running

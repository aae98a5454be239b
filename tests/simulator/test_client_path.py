"""The path from the replicas to the clients: a fixed one-way latency on every token, a buffering proxy that
forwards on a flush grid, and both taken from a profile measured at a client (``network.*: profile``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.cost.profile import StreamingFigures, load_profile
from simulator.errors import ConfigError
from simulator.results.request_log import RequestLog
from simulator.scenario import load_mapping
from simulator.simulation import run

PROFILE = "h200-llama-3-8b-tp1-analytic"
BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "client-path",
    "seed": 3,
    "workload": {
        "num_requests": 120,
        "arrival": {"process": "poisson", "rate_rps": 40},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 400},
    },
    "fleet": {"replicas": 2, "profile": PROFILE},
    "engine": {"preset": "vllm"},
}


def columns(overrides: list[str], raw: dict[str, Any] = BASE) -> dict[str, np.ndarray]:
    result = run(load_mapping(raw, overrides), check=True)
    return result.variants["base"].requests.columns()


def test_a_proxy_moves_first_and_last_tokens_to_its_next_flush() -> None:
    plain = columns([])
    flushed = columns(["network.flush_interval_ms=250"])
    for name in ("first_token_s", "finish_s"):
        before, after = plain[name], flushed[name]
        ticks = after / 0.25
        assert np.allclose(ticks, np.round(ticks)), "every delivery lies on the flush grid"
        assert (after >= before - 1e-12).all() and (after < before + 0.25 + 1e-9).all()
    # The engine's schedule is the same: only what the client sees moved.
    assert np.array_equal(plain["first_scheduled_s"], flushed["first_scheduled_s"])
    assert np.array_equal(plain["produced_tokens"], flushed["produced_tokens"])


def test_flush_grid_keeps_deliveries_in_order() -> None:
    log = RequestLog(3)
    for rid, (arrival, first, last) in enumerate([(0.0, 0.01, 0.01), (0.0, 0.1, 0.3), (0.05, 0.2999, 0.3001)]):
        log.on_arrival(rid, arrival, 10, 5, None)
        log.on_first_token(rid, first)
        log.on_finish(rid, last, 0, 0, 5)
    log.flush_deliveries(0.1)
    c = log.columns()
    assert np.allclose(c["first_token_s"], [0.1, 0.1, 0.3]) and np.allclose(c["finish_s"], [0.1, 0.3, 0.4])


def profile_with_streaming(tmp_path: Path, latency_ms: float, flush_ms: float) -> Path:
    profile = load_profile(PROFILE).model_copy(update={
        "streaming": StreamingFigures(latency_ms=latency_ms, flush_interval_ms=flush_ms, source="test")})
    path = tmp_path / f"{PROFILE}.yaml"
    profile.save(path)
    return path


def test_network_figures_from_the_profile_equal_the_same_figures_given(tmp_path: Path) -> None:
    raw = {**BASE, "fleet": {**BASE["fleet"], "profile": str(profile_with_streaming(tmp_path, 12.5, 100.0))}}
    from_profile = columns(["network.latency_ms=profile", "network.flush_interval_ms=profile"], raw)
    given = columns(["network.latency_ms=12.5", "network.flush_interval_ms=100"], raw)
    for name in ("first_token_s", "finish_s"):
        assert np.array_equal(from_profile[name], given[name])
    plain = columns([], raw)
    assert np.allclose(given["first_token_s"] - plain["first_token_s"], 0.0125, atol=0.1 + 1e-9)
    assert (given["first_token_s"] > plain["first_token_s"]).all()


def test_a_profile_without_streaming_figures_is_one_line_naming_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        run(load_mapping(BASE, ["network.latency_ms=profile"]))
    assert caught.value.field == "network.latency_ms" and "calibrate --endpoint" in caught.value.message


@pytest.mark.parametrize("bad", ["network.flush_interval_ms=-1", "network.latency_ms=fast"])
def test_bad_network_figures_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_mapping(BASE, [bad])
    assert "network" in str(caught.value)

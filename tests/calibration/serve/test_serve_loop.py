"""The serving loop without HTTP: the core's admission verdict reaches the client, a failing step fails
only the requests in flight, and the step and request logs hold the engine's own timings."""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibration.engine.configs import get_model
from calibration.engine.engine import Engine
from calibration.serve.loop import Accepted, EngineLoop, Rejected, RequestStream, StreamItem, Tokens
from calibration.serve.protocol import FinishReason
from simulator.core.config import SchedulerConfig

BOUND_S = 30.0


def _engine(num_blocks: int = 64) -> Engine:
    return Engine(get_model("tiny"), SchedulerConfig(num_blocks=num_blocks, max_model_len=4096), eos_token_id=0)


async def _drain(stream: RequestStream) -> list[StreamItem]:
    items: list[StreamItem] = []
    while True:
        item = await asyncio.wait_for(stream.get(), BOUND_S)
        items.append(item)
        if isinstance(item, Rejected) or (isinstance(item, Tokens) and item.finish is not None):
            return items


@pytest.fixture
def loop_of() -> Iterator[list[EngineLoop]]:
    started: list[EngineLoop] = []
    yield started
    for loop in started:
        loop.stop()


def _run(loop: EngineLoop, started: list[EngineLoop], *requests: tuple[list[int], int]) -> list[list[StreamItem]]:
    async def go() -> list[list[StreamItem]]:
        loop.start(asyncio.get_running_loop())
        started.append(loop)
        streams = [loop.submit(prompt, n, ignore_eos=True) for prompt, n in requests]
        return list(await asyncio.gather(*(_drain(s) for s in streams)))

    return asyncio.run(go())


def test_tokens_arrive_in_order_and_finish_at_max_tokens(loop_of: list[EngineLoop]) -> None:
    loop = EngineLoop(_engine())
    a, b = _run(loop, loop_of, ([1, 2, 3], 5), ([4] * 40, 3))
    for items, n in ((a, 5), (b, 3)):
        assert isinstance(items[0], Accepted)
        toks = [i for i in items if isinstance(i, Tokens)]
        assert [len(t.token_ids) for t in toks] == [1] * n and toks[-1].finish is FinishReason.LENGTH
        assert [t.time_s for t in toks] == sorted(t.time_s for t in toks)
    assert not loop.engine.outputs  # the loop keeps nothing of finished requests
    assert not loop.engine.records


def test_the_cores_admission_verdict_reaches_the_client(loop_of: list[EngineLoop]) -> None:
    loop = EngineLoop(_engine(num_blocks=4))  # 64 tokens of KV in all
    (items,) = _run(loop, loop_of, ([1] * 100, 10))
    assert len(items) == 1 and isinstance(items[0], Rejected) and "at most 64" in items[0].reason
    assert loop.stats.requests_rejected == 1


def test_a_failing_step_fails_its_requests_not_the_loop(loop_of: list[EngineLoop],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    real_step = engine.step
    calls = {"n": 0}

    def flaky() -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fell over")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky)
    loop = EngineLoop(engine)

    async def go() -> tuple[list[StreamItem], list[StreamItem]]:
        loop.start(asyncio.get_running_loop())
        loop_of.append(loop)
        first = await _drain(loop.submit([1, 2], 6, ignore_eos=True))
        second = await _drain(loop.submit([3, 4], 4, ignore_eos=True))
        return first, second

    first, second = asyncio.run(go())
    last = first[-1]
    assert isinstance(last, Tokens) and last.finish is FinishReason.ABORT and "device fell over" in (last.error or "")
    assert isinstance(second[-1], Tokens) and second[-1].finish is FinishReason.LENGTH
    assert loop.stats.step_errors == 1 and loop.stats.kv_used_blocks == 0 and loop.running


def test_stop_refuses_new_requests(loop_of: list[EngineLoop]) -> None:
    loop = EngineLoop(_engine())

    async def go() -> list[StreamItem]:
        loop.start(asyncio.get_running_loop())
        await asyncio.to_thread(loop.stop)
        return await _drain(loop.submit([1], 2, ignore_eos=True))

    (item,) = asyncio.run(go())
    assert isinstance(item, Rejected)


def test_logs_hold_every_step_and_every_token_time(loop_of: list[EngineLoop], tmp_path: Path) -> None:
    loop = EngineLoop(_engine(), log_dir=tmp_path)
    _run(loop, loop_of, ([1, 2, 3], 4), ([9] * 20, 2))
    loop.stop()
    steps = list(csv.DictReader((tmp_path / "steps.csv").open()))
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(len(line["token_s"]) for line in lines) == [2, 4]
    assert sum(int(s["num_new_tokens"]) for s in steps) == 3 + 20 + (4 - 1) + (2 - 1)
    for line in lines:
        assert line["received_s"] <= line["added_s"] <= line["token_s"][0]

"""The OpenAI-compatible API on loopback: streams parsed by OpenAI's client and by httpx-sse (not by our
own reader), errors, metrics, and the engine left clean after disconnects and cancellations."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
httpx_sse = pytest.importorskip("httpx_sse")

from calibration.serve import tokens  # noqa: E402
from calibration.serve.server import ServerThread  # noqa: E402

WAIT_S = 30.0
"""Longest wait for the engine to reach a state (a bound on the test, not a timing check)."""


def _settle(server: ServerThread) -> None:
    """Wait until the engine holds no request (bounded), then check it holds no KV block either."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        s = server.loop.stats
        if s.num_running == 0 and s.num_waiting == 0 and not server.loop._live:
            break
        time.sleep(0.02)
    s = server.loop.stats
    assert (s.num_running, s.num_waiting, s.kv_used_blocks) == (0, 0, 0)


def test_completion_stream_parsed_by_the_openai_client(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
    stream = client.completions.create(model="tiny", prompt="hello there", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 7 and all(len(t) == 1 for t in texts)  # one token, one character, per chunk
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len("hello there"), 7)
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_parsed_by_the_openai_client(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, stream=True,  # type: ignore[arg-type]
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and len("".join(d.content or "" for d in deltas)) == 5
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 5
    assert usage.prompt_tokens == len(tokens.encode(tokens.chat_prompt([("system", "be brief"), ("user", "hi")])))


def test_stream_framing_read_by_httpx_sse(server: ServerThread) -> None:
    body = {"model": "tiny", "prompt": [3, 1, 4, 1, 5], "max_tokens": 4, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client, \
            httpx_sse.connect_sse(client, "POST", "/v1/completions", json=body) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        data = [event.data for event in source.iter_sse()]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 4
    assert "usage" not in chunks[0]  # not asked for


def test_whole_response_without_streaming(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
    done = client.completions.create(model="tiny", prompt=[7] * 20, max_tokens=3, extra_body={"ignore_eos": True})
    assert len(done.choices[0].text) == 3 and done.usage is not None and done.usage.prompt_tokens == 20


@pytest.mark.parametrize(("body", "status", "param"), [
    (b"{not json", 400, None),
    (json.dumps({"model": "gpt-4", "prompt": "a"}).encode(), 404, "model"),
    (json.dumps({"model": "tiny", "prompt": "a", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "a", "max_tokens": -3}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "a" * 1100}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": [300]}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": ["a", "b"]}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": ""}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny"}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": "a", "max_tokens": "many"}).encode(), 400, "max_tokens"),
    (json.dumps([1, 2]).encode(), 400, None),
])
def test_bad_requests_get_openai_errors(server: ServerThread, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(f"{server.url}/v1/completions", content=body, timeout=WAIT_S,
                          headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"] and error["param"] == param
    assert httpx.get(f"{server.url}/health", timeout=WAIT_S).status_code == 200


def test_the_openai_client_raises_on_an_unknown_model(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_the_context_limit_counts_prompt_and_output(server: ServerThread) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 1024},
                          timeout=WAIT_S)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


def test_models_health_and_metrics(server: ServerThread) -> None:
    models = httpx.get(f"{server.url}/v1/models", timeout=WAIT_S).json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 1024
    text = httpx.get(f"{server.url}/metrics", timeout=WAIT_S).text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hits_total",
                 "prompt_tokens_total", "generation_tokens_total"):
        assert f"fleetsim:{name}{{" in text


def test_disconnect_mid_stream_aborts_and_frees_kv(server: ServerThread) -> None:
    _settle(server)
    aborted = server.loop.stats.requests_aborted
    body = {"model": "tiny", "prompt": [5] * 200, "max_tokens": 800, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client, \
            client.stream("POST", "/v1/completions", json=body) as response:
        got: list[str] = []
        for line in response.iter_lines():
            if line.startswith("data:"):
                got.append(line)
            if len(got) == 3:
                break
        assert server.loop.stats.kv_used_blocks >= 200 // 16  # the prompt's blocks are held while it runs
    # The connection is closed here, 3 of 800 tokens in.
    _settle(server)
    assert server.loop.stats.requests_aborted == aborted + 1


def test_survives_200_requests_with_random_cancels(server: ServerThread) -> None:
    _settle(server)
    before = server.loop.stats
    rng = random.Random(26)
    plans = [(rng.randrange(1, 120), rng.randrange(1, 40), rng.random() < 0.5, rng.randrange(0, 8))
             for _ in range(200)]

    async def one(client: httpx.AsyncClient, gate: asyncio.Semaphore, plan: tuple[int, int, bool, int]) -> str:
        prompt, out, cancel, after = plan
        body = {"model": "tiny", "prompt": [rng.randrange(256) for _ in range(prompt)], "max_tokens": out,
                "stream": True, "ignore_eos": True}
        async with gate, client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            seen = 0
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    return "done"
                if line.startswith("data:"):
                    seen += 1
                    if cancel and seen > after:
                        return "cancelled"  # leaving the block closes the connection mid-stream
            return "cut"

    async def run_all() -> list[str]:
        gate = asyncio.Semaphore(24)
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
            return await asyncio.gather(*(one(client, gate, p) for p in plans))

    outcomes = asyncio.run(run_all())
    assert "cut" not in outcomes and outcomes.count("cancelled") > 50
    _settle(server)
    after = server.loop.stats
    left = after.requests_finished + after.requests_aborted
    assert left - (before.requests_finished + before.requests_aborted) == 200
    assert after.step_errors == 0 and server.loop.running
    ok = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                    timeout=WAIT_S)
    assert ok.status_code == 200

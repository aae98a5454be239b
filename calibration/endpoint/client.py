"""One streamed request to an OpenAI-compatible endpoint, timed as the client sees it.

The Server-Sent Events are parsed by ``httpx-sse``; each event that carries text is a *chunk*, stamped on
arrival (``time.perf_counter``). What is kept follows vLLM's serving benchmark: the time the request was
sent, every text chunk's arrival, the usage the server reports (``stream_options.include_usage``), and an
error if the request failed. A chunk's token count is not visible to a client without the model's
tokenizer: output tokens come from the usage, or count one per chunk when the server sends none.

Must work against any OpenAI-compatible server (vLLM, SGLang, TGI, fleetsim serve): only the public
wire format is read.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx
from httpx_sse import aconnect_sse


class Api(StrEnum):
    COMPLETIONS = "completions"
    """``/v1/completions``: the prompt is sent as token ids (exact lengths) or text."""
    CHAT = "chat"
    """``/v1/chat/completions``: the prompt is one user message of text."""


@dataclass(slots=True)
class StreamRecord:
    """What the client saw of one request. Times are seconds on the bench's clock (its start is 0)."""

    index: int
    scheduled_s: float
    """When the workload said it arrives."""
    prompt_tokens: int
    max_tokens: int
    sent_s: float = math.nan
    """When it was sent (later than scheduled when ``--max-concurrency`` held it back)."""
    chunk_s: list[float] = field(default_factory=list)
    """Arrival of each chunk carrying text."""
    chunk_chars: list[int] = field(default_factory=list)
    usage_output_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    response_id: str | None = None
    status: int | None = None
    """HTTP status; None when no response came."""
    error: str | None = None
    finished: bool = False
    """The stream ended properly (a finish reason and ``[DONE]``, or the end of the body after one)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished and bool(self.chunk_s)

    @property
    def output_tokens(self) -> int:
        """The server's count, else one per chunk."""
        return self.usage_output_tokens if self.usage_output_tokens is not None else len(self.chunk_s)


def request_body(api: Api, model: str, prompt: list[int] | str, max_tokens: int, *, ignore_eos: bool) -> dict[str, Any]:
    """The JSON of one streamed request (greedy, exactly ``max_tokens`` tokens when ``ignore_eos``)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
                            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's and SGLang's extension; fleetsim serve has it too
    if api is Api.COMPLETIONS:
        body["prompt"] = prompt
    else:
        text = prompt if isinstance(prompt, str) else " ".join(str(t) for t in prompt)
        body["messages"] = [{"role": "user", "content": text}]
    return body


def api_path(api: Api) -> str:
    return "/v1/completions" if api is Api.COMPLETIONS else "/v1/chat/completions"


async def stream_request(client: httpx.AsyncClient, api: Api, body: dict[str, Any], record: StreamRecord,
                         clock0: float) -> None:
    """Send ``body`` and read its stream into ``record`` (never raises for a failed request: the failure
    goes into ``record.error``)."""
    record.sent_s = time.perf_counter() - clock0
    try:
        async with aconnect_sse(client, "POST", api_path(api), json=body) as source:
            response = source.response
            record.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {_error_message(text)}"
                return
            saw_finish = False
            async for event in source.aiter_sse():
                now = time.perf_counter() - clock0
                if event.data == "[DONE]":
                    record.finished = saw_finish or bool(record.chunk_s)
                    return
                chunk = json.loads(event.data)
                if "error" in chunk and "choices" not in chunk:
                    record.error = f"stream error: {_error_message(json.dumps(chunk))}"
                    return
                record.response_id = record.response_id or chunk.get("id")
                usage = chunk.get("usage")
                if usage:
                    record.usage_output_tokens = usage.get("completion_tokens")
                    record.usage_prompt_tokens = usage.get("prompt_tokens")
                for choice in chunk.get("choices") or ():
                    piece = choice.get("text") if api is Api.COMPLETIONS else (choice.get("delta") or {}).get("content")
                    if piece:
                        record.chunk_s.append(now)
                        record.chunk_chars.append(len(piece))
                    if choice.get("finish_reason"):
                        saw_finish = True
            record.finished = saw_finish
            if not saw_finish:
                record.error = "the stream ended without a finish reason"
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as err:
        record.error = f"{type(err).__name__}: {err}"


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, else the text (cut short)."""
    try:
        body = json.loads(text)
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else str(error)
        return str(message)[:300]
    except (ValueError, AttributeError):
        return text[:300]

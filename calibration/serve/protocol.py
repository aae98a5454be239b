"""The OpenAI-compatible wire format the server speaks: request bodies (validated by pydantic), response
and stream-chunk bodies, and OpenAI-style errors.

Field names and shapes follow OpenAI's completions and chat completions APIs as vLLM serves them:
``max_tokens`` (chat also ``max_completion_tokens``), ``stream``, ``stream_options.include_usage`` (usage
in a last chunk with no choices), vLLM's ``ignore_eos``, a prompt given as text or as a list of token
ids. Fields a client may send that change nothing here (``temperature``, ``top_p``, ``seed``...) are
accepted and ignored: the engine samples greedily. Plain data in, plain dicts out; nothing here touches
the engine or the network.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FinishReason(StrEnum):
    LENGTH = "length"
    """``max_tokens`` reached."""
    STOP = "stop"
    """The end-of-sequence token (only without ``ignore_eos``)."""
    ABORT = "abort"
    """The server gave up on it (shut down, or the engine failed): not an OpenAI reason, as in vLLM."""


class _Body(BaseModel):
    # Unknown fields are ignored, not refused: OpenAI clients send sampling knobs this engine has no use for.
    model_config = ConfigDict(frozen=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    """Send a last chunk with ``usage`` and no choices before ``[DONE]``."""


class _Request(_Body):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    """vLLM's extension: generate exactly the requested tokens, never stopping at EOS (benchmarks set it)."""
    n: Literal[1] = 1
    """Completions per prompt: one (several would be several requests to the engine)."""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    """Text, or token ids; a one-element list of either is that prompt (several prompts are refused)."""
    max_tokens: int | None = Field(default=16, ge=1)
    """Tokens to generate; OpenAI's default of 16."""


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's newer name for ``max_tokens``; either may be given. Neither: up to the context length."""

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    NOT_FOUND = "not_found_error"
    SERVER = "server_error"


def error_body(message: str, error_type: ErrorType, *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type.value, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Kind(StrEnum):
    """Which endpoint a response belongs to: decides the object names and where the text goes."""

    COMPLETION = "completion"
    CHAT = "chat"


class ResponseShape:
    """Builds the bodies of one response: its stream chunks, or the whole non-streamed response."""

    def __init__(self, kind: Kind, response_id: str, model: str, *, include_usage: bool) -> None:
        self.kind = kind
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish: FinishReason | None, *, first: bool = False) -> dict[str, Any]:
        """A stream chunk carrying ``text`` (and the finish reason on the last one)."""
        reason = None if finish is None else finish.value
        if self.kind is Kind.COMPLETION:
            body = self._head("text_completion")
            body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]
        else:
            body = self._head("chat.completion.chunk")
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        if self.include_usage:
            body["usage"] = None  # present on every chunk, filled only on the last (OpenAI does the same)
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The chunk after the last token when ``include_usage``: no choices, the usage."""
        body = self._head("text_completion" if self.kind is Kind.COMPLETION else "chat.completion.chunk")
        body["choices"] = []
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body

    def response(self, text: str, finish: FinishReason, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The whole response of a request that did not ask to stream."""
        if self.kind is Kind.COMPLETION:
            body = self._head("text_completion")
            body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish.value}]
        else:
            body = self._head("chat.completion")
            body["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": finish.value}]
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body

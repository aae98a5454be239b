"""The HTTP face of the serving loop: an OpenAI-compatible FastAPI app.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as Server-Sent Events,
``data: {chunk}`` lines ending in ``data: [DONE]``, or whole), ``GET /v1/models``, ``GET /health`` and
``GET /metrics`` (Prometheus text: the engine's queue, running batch, KV use, prefix-cache hits, tokens).

Every refusal is an OpenAI-style JSON error with a 4xx status (malformed JSON, a field of the wrong type,
an unknown model, ``max_tokens`` < 1, a prompt longer than the model's context, several prompts at once),
decided here before the request reaches the engine thread, or by the core's own admission rule after.
A client that disconnects mid-stream has its request aborted, which frees its KV blocks.

Never touches the engine: it talks to ``EngineLoop`` only.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException as StarletteHTTPException

from calibration.serve import tokens
from calibration.serve.loop import EngineLoop, Rejected, RequestStream, Tokens
from calibration.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorType,
    Kind,
    ResponseShape,
    error_body,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedModel:
    """What the server tells clients about the model it serves."""

    name: str
    """The ``model`` a request must name (the catalogue name, e.g. ``small``)."""
    max_model_len: int
    """Most prompt plus output tokens of one request."""
    vocab_size: int


class ApiError(Exception):
    """A request refused with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, error_type: ErrorType = ErrorType.INVALID_REQUEST, *,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, error_type, param=param, code=code)


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body, status_code=err.status)


def build_app(loop: EngineLoop, model: ServedModel) -> FastAPI:
    """The app; its lifespan starts the engine thread and stops it (aborting what is in flight)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(loop.stop)

    app = FastAPI(title="fleetsim serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    boot = secrets.token_hex(4)
    """Response ids are ``cmpl-<boot>-<engine request id>``: unique across restarts, and they name the line
    of the server's request log that holds the same request."""
    registry = CollectorRegistry()
    registry.register(_EngineCollector(loop, model.name))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(err))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = ErrorType.NOT_FOUND if err.status_code == 404 else ErrorType.INVALID_REQUEST
        return _error_response(ApiError(err.status_code, str(err.detail), kind))

    @app.exception_handler(Exception)
    async def server_error(request: Request, err: Exception) -> JSONResponse:
        return _error_response(ApiError(500, f"internal error: {type(err).__name__}", ErrorType.SERVER))

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = loop.running
        return JSONResponse({"status": "ok" if ok else "engine stopped"}, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model.name, "object": "model", "created": 0,
                                            "owned_by": "fleetsim", "max_model_len": model.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> StreamingResponse | JSONResponse:
        _check_model(body.model, model)
        prompt = _completion_prompt(body, model)
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        return await _serve(loop, model, Kind.COMPLETION, boot, body, prompt, max_tokens)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> StreamingResponse | JSONResponse:
        _check_model(body.model, model)
        prompt = tokens.encode(tokens.chat_prompt([(m.role, m.text()) for m in body.messages]))
        requested = body.requested_tokens
        max_tokens = requested if requested is not None else max(1, model.max_model_len - len(prompt))
        return await _serve(loop, model, Kind.CHAT, boot, body, prompt, max_tokens)

    return app


def _validation_error(err: RequestValidationError) -> ApiError:
    """pydantic's complaint as one OpenAI error: the first problem, with the field it is about."""
    problems = err.errors()
    if not problems:
        return ApiError(400, "invalid request body")
    first = problems[0]
    if first.get("type") == "json_invalid":
        return ApiError(400, "the request body is not valid JSON", code="invalid_json")
    where = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(where) or None
    message = str(first.get("msg", "invalid value"))
    return ApiError(400, f"{param}: {message}" if param else message, param=param)


def _check_model(name: str, model: ServedModel) -> None:
    if name != model.name:
        raise ApiError(404, f"the model `{name}` does not exist; this server serves `{model.name}`",
                       ErrorType.NOT_FOUND, param="model", code="model_not_found")


def _completion_prompt(body: CompletionRequest, model: ServedModel) -> list[int]:
    """The prompt's token ids: text is encoded (calibration/serve/tokens.py), ids are range-checked."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(400, "one prompt per request (send several requests)", param="prompt")
        prompt = prompt[0]
    ids = tokens.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if any(not 0 <= t < model.vocab_size for t in ids):
        raise ApiError(400, f"prompt token ids must be in [0, {model.vocab_size})", param="prompt")
    return ids


async def _serve(loop: EngineLoop, model: ServedModel, kind: Kind, boot: str,
                 body: CompletionRequest | ChatCompletionRequest, prompt: list[int],
                 max_tokens: int) -> StreamingResponse | JSONResponse:
    if not prompt:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if len(prompt) + max_tokens > model.max_model_len:
        raise ApiError(400, f"this model's maximum context length is {model.max_model_len} tokens; the request "
                            f"asks for {len(prompt)} prompt + {max_tokens} output tokens", param="max_tokens",
                       code="context_length_exceeded")
    handle = loop.submit(prompt, max_tokens, ignore_eos=body.ignore_eos)
    try:
        first = await handle.get()  # accepted, or refused by the core's admission rule
    except BaseException:
        loop.abort(handle)
        raise
    if isinstance(first, Rejected):
        status = 503 if not loop.running else 400
        raise ApiError(status, first.reason, ErrorType.SERVER if status == 503 else ErrorType.INVALID_REQUEST)
    response_id = f"{'cmpl' if kind is Kind.COMPLETION else 'chatcmpl'}-{boot}-{handle.request_id}"
    shape = ResponseShape(kind, response_id, body.model, include_usage=body.include_usage)
    if body.stream:
        return StreamingResponse(_events(loop, handle, shape), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _whole(loop, handle, shape)


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def _events(loop: EngineLoop, handle: RequestStream, shape: ResponseShape) -> AsyncIterator[str]:
    """The SSE body: a chunk per step's tokens, the finish on the last, the usage chunk if asked, [DONE].
    Cancelled when the client disconnects (Starlette watches for it): the request is then aborted."""
    count = 0
    try:
        while True:
            item = await handle.get()
            if not isinstance(item, Tokens):
                continue
            if item.error is not None:
                yield _sse(error_body(item.error, ErrorType.SERVER))
                break
            count += len(item.token_ids)
            yield _sse(shape.chunk(tokens.decode(item.token_ids), item.finish, first=count == len(item.token_ids)))
            if item.finish is not None:
                if shape.include_usage:
                    yield _sse(shape.usage_chunk(handle.prompt_tokens, count))
                break
        yield "data: [DONE]\n\n"
    finally:
        loop.abort(handle)  # a no-op once the request finished


async def _whole(loop: EngineLoop, handle: RequestStream, shape: ResponseShape) -> JSONResponse:
    """A request that did not ask to stream: wait for every token, answer once."""
    ids: list[int] = []
    try:
        while True:
            item = await handle.get()
            if not isinstance(item, Tokens):
                continue
            if item.error is not None:
                raise ApiError(500, item.error, ErrorType.SERVER)
            ids.extend(item.token_ids)
            if item.finish is not None:
                return JSONResponse(shape.response(tokens.decode(ids), item.finish, handle.prompt_tokens, len(ids)))
    finally:
        loop.abort(handle)


class _EngineCollector(Collector):
    """The loop's latest counters as Prometheus metrics, read at scrape time (names after vLLM's, under
    ``fleetsim:``)."""

    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self._loop = loop
        self._model = model_name

    def collect(self) -> Iterator[Any]:
        s = self._loop.stats
        labels = ["model_name"]
        value = [self._model]

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"fleetsim:{name}", doc, labels=labels)
            g.add_metric(value, v)
            return g

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"fleetsim:{name}", doc, labels=labels)
            c.add_metric(value, v)
            return c

        yield gauge("num_requests_running", "Requests holding KV blocks (in the running batch).", s.num_running)
        yield gauge("num_requests_waiting", "Requests queued (waiting or swapped out).", s.num_waiting)
        yield gauge("kv_cache_usage_perc", "Share of KV blocks referenced by requests (0-1).", s.kv_used_frac)
        yield gauge("kv_cache_used_blocks", "KV blocks referenced by requests.", s.kv_used_blocks)
        yield gauge("kv_cache_total_blocks", "KV blocks in the pool.", s.kv_total_blocks)
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.", s.prefix_hit_tokens)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_query_tokens)
        yield counter("prompt_tokens", "Prompt tokens of accepted requests.", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens)
        yield counter("request_success", "Requests that finished.", s.requests_finished)
        yield counter("request_aborted", "Requests aborted (client gone, server stopping).", s.requests_aborted)
        yield counter("request_rejected", "Requests the core refused.", s.requests_rejected)
        yield counter("engine_steps", "Engine steps run.", s.num_steps)
        yield counter("engine_busy_seconds", "Wall time inside engine steps.", s.busy_s)
        yield counter("engine_step_errors", "Engine steps that raised (their requests were aborted).", s.step_errors)

"""One router's request handling: the gate (gate.py), tokenising and the request's shape (request_shape.py),
placement and dispatch, the response.

`Router` holds everything one router process owns (store, metrics, tracer, dispatcher, tokenisers,
limits); `zipkv.controlplane.app.build_app` wires it to HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace

from zipkv.controlplane import gate
from zipkv.controlplane.config import ModelConfig, RouterConfig
from zipkv.controlplane.context import model_context_tokens
from zipkv.controlplane.dispatch import Dispatcher
from zipkv.controlplane.dispatch_request import Sampling
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.openai_api import (
    ChatRequest,
    CompletionRequest,
    ResponseShape,
    error_body,
    unsupported_field,
)
from zipkv.controlplane.placement import RequestShape
from zipkv.controlplane.relay import Outcome, Redispatch, Relay, RelayResponse, collect, stream_sse
from zipkv.controlplane.reopen import Reopener
from zipkv.controlplane.request_shape import find_model, prompt_ids, request_shape, sampling
from zipkv.controlplane.state import MemoryStore, Store
from zipkv.controlplane.telemetry import tracer
from zipkv.controlplane.tokenizer import Tokenizer, load_tokenizer
from zipkv.controlplane.worker_rpc import DispatchError
from zipkv.controlplane.worker_stream import Stream

log = logging.getLogger("zipkv.controlplane.router")


def make_store(cfg: RouterConfig) -> Store:
    if cfg.state.backend == "redis":
        from zipkv.controlplane.redis_store import RedisStore

        return RedisStore(cfg)
    pl = cfg.placement
    return MemoryStore(
        pl.expire_after_ms, pl.reservation_ttl_s, report_delay_bound_ms=pl.report_delay_bound_ms
    )


class Router:
    """Everything one router process holds; created by build_app."""

    def __init__(self, cfg: RouterConfig, store: Store, provider: trace.TracerProvider) -> None:
        self.cfg, self.store = cfg, store
        self.metrics = RouterMetrics(tuple(m.name for m in cfg.models))
        self.tracer = tracer(provider)
        self.dispatcher = Dispatcher(cfg, store, self.metrics, self.tracer)
        self.reopen = Reopener(cfg, self.dispatcher, self.metrics)
        if cfg.security.tls is not None:
            cfg.security.tls.check_readable()
        self.tokenizers: dict[str, Tokenizer] = {
            m.name: load_tokenizer(m.tokenizer, m.chat_template) for m in cfg.models
        }
        for m in cfg.models:
            if getattr(self.tokenizers[m.name], "chat_template", True) is None:
                log.warning(
                    "model %s has no chat template: chat completions get 400 (completions work)", m.name
                )
        self.limiter = gate.RateLimiter(cfg.limits.requests_per_s, cfg.limits.burst)
        per_min = cfg.security.auth_failures_per_minute
        self.auth_failures = gate.RateLimiter(per_min / 60.0, max(per_min, 1))  # rate 0: off
        self.inflight = 0
        self.report_port = 0

    def _done(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.set(self.inflight)

    def check_key(self, request: Request) -> str:
        """The caller's API key (see gate.check_api_key), with failed attempts limited per client
        address: past `security.auth_failures_per_minute` the address gets 429 before any key check."""
        client = request.client.host if request.client else ""
        if not self.auth_failures.has_tokens(client):
            self.metrics.rejections.labels("auth_failures").inc()
            raise gate.HttpError(
                429,
                "too many failed API-key attempts from this address; wait a minute and check the key",
                "rate_limit_error",
                "auth_failures",
                retry_after_s=60,
            )
        try:
            return gate.check_api_key(request, self.cfg)
        except gate.HttpError:
            self.auth_failures.allow(client)  # spends one of the address's attempts
            self.metrics.rejections.labels("unauthenticated").inc()
            raise

    def _pass_gate(self, request: Request) -> None:
        """The API key, the rate limit and the in-flight limit (429 past either limit)."""
        key = self.check_key(request)
        lim = self.cfg.limits
        if not self.limiter.allow(key or (request.client.host if request.client else "")):
            self.metrics.rejections.labels("rate_limited").inc()
            raise gate.HttpError(
                429,
                "rate limit exceeded; slow down",
                "rate_limit_error",
                "rate_limited",
                retry_after_s=lim.retry_after_s,
            )
        if lim.max_inflight_requests and self.inflight >= lim.max_inflight_requests:
            self.metrics.rejections.labels("over_capacity").inc()
            raise gate.HttpError(
                429,
                f"router is at its limit of {lim.max_inflight_requests} requests in flight",
                "rate_limit_error",
                "over_capacity",
                retry_after_s=lim.retry_after_s,
            )

    def context_tokens(self, model: ModelConfig) -> int:
        """The model's context: the configured one, lowered to the largest that a live worker reports
        (a request that no worker could hold is malformed, not a capacity problem)."""
        return model_context_tokens(model.name, model.max_context_tokens, self.store.snapshot().workers)

    async def handle(self, request: Request, kind: str) -> Response:
        t_in = time.perf_counter()
        self._pass_gate(request)
        # Counted from the gate (not from the first token), so a burst cannot pass the in-flight limit;
        # once a Relay exists it owns the count (its finish() calls _done exactly once).
        self.inflight += 1
        self.metrics.inflight.set(self.inflight)
        owner: list[Relay] = []
        try:
            return await self._serve(request, kind, t_in, owner)
        finally:
            if not owner:
                self._done()

    async def _serve(self, request: Request, kind: str, t_in: float, owner: list[Relay]) -> Response:
        req = await self._parse(request, kind)
        model = find_model(self.cfg, req.model)
        tok = self.tokenizers[model.name]
        ids = prompt_ids(self.cfg, req, tok)
        slo = gate.slo_from_headers(request, self.cfg)
        shape = request_shape(req, model, len(ids), slo, self.context_tokens(model))
        samp = sampling(req, tok)
        stream, span = await self._start(kind, req, shape, ids, samp)
        relay = Relay(
            stream,
            tok,
            req.stop_strings(),
            len(ids),
            self.metrics,
            model.name,
            t_in,
            span,
            slo_ms=(shape.slo_ttft_ms, shape.slo_tpot_ms),
        )
        owner.append(relay)
        if req.stream:
            again = self.reopen.resume(shape, ids, samp, relay)
        else:
            again = self.reopen.restart(shape, ids, samp, span)
        return await self._respond(request, kind, req, relay, model.name, again)

    async def _parse(self, request: Request, kind: str) -> ChatRequest | CompletionRequest:
        """The body as the request model of ``kind``; 400 for a field this server does not support."""
        data = await gate.read_json(request, self.cfg.http.max_request_bytes)
        field = unsupported_field(data) if isinstance(data, dict) else None
        if field is not None:
            raise gate.bad_request(
                f"{field} is not supported by this server; remove it from the request", field, "unsupported"
            )
        parsed: ChatRequest | CompletionRequest = gate.parse_model(
            ChatRequest if kind == "chat" else CompletionRequest, data
        )
        return parsed

    async def _start(
        self,
        kind: str,
        req: ChatRequest | CompletionRequest,
        shape: RequestShape,
        prompt_ids: list[int],
        sampling: Sampling,
    ) -> tuple[Stream, trace.Span]:
        """The request's server span and its dispatch: the worker's stream once it has a first event. A
        dispatch that fails answers the client in the OpenAI error shape, and ends the span."""
        op = "chat" if kind == "chat" else "text_completion"
        span = self.tracer.start_span(
            f"{op} {shape.model}",
            kind=trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": op,
                "gen_ai.request.model": shape.model,
                "gen_ai.request.max_tokens": shape.max_new_tokens,
                "gen_ai.request.temperature": req.temperature,
                "gen_ai.request.top_p": req.top_p,
                "gen_ai.usage.input_tokens": len(prompt_ids),
            },
        )
        try:
            with trace.use_span(span, end_on_exit=False):
                stream = await self.dispatcher.start(shape, prompt_ids, sampling)
        except DispatchError as exc:
            self.metrics.rejections.labels(exc.reason).inc()
            span.set_status(trace.Status(trace.StatusCode.ERROR, exc.message))
            span.end()
            raise gate.HttpError(
                exc.status,
                exc.message,
                "server_error" if exc.status >= 500 else "invalid_request_error",
                exc.reason,
                retry_after_s=exc.retry_after_s,
            ) from None
        except BaseException:
            span.end()
            raise
        span.set_attribute("zipkv.worker.id", stream.worker_id)
        return stream, span

    async def _respond(
        self,
        request: Request,
        kind: str,
        req: ChatRequest | CompletionRequest,
        relay: Relay,
        model_name: str,
        again: Redispatch | None,
    ) -> Response:
        """Server-sent events while the relay streams, or one JSON body once it finished."""
        shape_out = ResponseShape("chat" if kind == "chat" else "text", model_name, uuid.uuid4().hex[:24])
        retries = self.cfg.dispatch.mid_request_retries
        if req.stream:
            body = stream_sse(relay, shape_out, req.include_usage, self._done, again, retries)
            headers = {"cache-control": "no-cache", "x-zipkv-worker": relay.stream.worker_id}
            return RelayResponse(relay, self._done, body, headers)
        out = await _collect_unless_gone(request, collect(relay, self._done, again, retries))
        if out.error:
            self.metrics.rejections.labels("worker_failed").inc()
            return JSONResponse(
                error_body(out.error + "; retry the request", "server_error", 502), status_code=502
            )
        return JSONResponse(
            shape_out.full(out.text, out.finish_reason, out.prompt_tokens, out.completion_tokens),
            headers={"x-zipkv-worker": relay.stream.worker_id},
        )


async def _collect_unless_gone(request: Request, collecting: Coroutine[Any, Any, Outcome]) -> Outcome:
    """Collect a non-streamed response; if the client goes away first, stop (the worker gets Abort)."""
    task = asyncio.ensure_future(collecting)
    while not task.done():
        await asyncio.wait([task], timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise gate.HttpError(499, "client closed the request", "invalid_request_error", "client_gone")
    return task.result()

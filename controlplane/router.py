"""One router's request handling: admission, tokenising, placement and dispatch, the response.

`Router` holds everything one router process owns (store, metrics, tracer, dispatcher, tokenisers,
limits); `zipkv.controlplane.app.build_app` wires it to HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace

from zipkv.controlplane import admission as adm
from zipkv.controlplane.chat_template import NoChatTemplate
from zipkv.controlplane.config import ModelConfig, RouterConfig
from zipkv.controlplane.context import fits_context, model_context_tokens
from zipkv.controlplane.dispatch import Dispatcher, DispatchError, Sampling
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.openai_api import (
    ChatRequest,
    CompletionRequest,
    ResponseShape,
    error_body,
    unsupported_field,
)
from zipkv.controlplane.placement import RequestShape
from zipkv.controlplane.relay import Outcome, Relay, RelayResponse, collect, stream_sse
from zipkv.controlplane.state import MemoryStore, Store
from zipkv.controlplane.telemetry import tracer
from zipkv.controlplane.tokenizer import Tokenizer, load_tokenizer

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
        self.limiter = adm.RateLimiter(cfg.limits.requests_per_s, cfg.limits.burst)
        per_min = cfg.security.auth_failures_per_minute
        self.auth_failures = adm.RateLimiter(per_min / 60.0, max(per_min, 1))  # rate 0: off
        self.inflight = 0
        self.report_port = 0

    def _done(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.set(self.inflight)

    def check_key(self, request: Request) -> str:
        """The caller's API key (see admission.check_api_key), with failed attempts limited per client
        address: past `security.auth_failures_per_minute` the address gets 429 before any key check."""
        client = request.client.host if request.client else ""
        if not self.auth_failures.has_tokens(client):
            self.metrics.rejections.labels("auth_failures").inc()
            raise adm.HttpError(
                429,
                "too many failed API-key attempts from this address; wait a minute and check the key",
                "rate_limit_error",
                "auth_failures",
                retry_after_s=60,
            )
        try:
            return adm.check_api_key(request, self.cfg)
        except adm.HttpError:
            self.auth_failures.allow(client)  # spends one of the address's attempts
            self.metrics.rejections.labels("unauthenticated").inc()
            raise

    def _admit(self, request: Request) -> None:
        key = self.check_key(request)
        lim = self.cfg.limits
        if not self.limiter.allow(key or (request.client.host if request.client else "")):
            self.metrics.rejections.labels("rate_limited").inc()
            raise adm.HttpError(
                429,
                "rate limit exceeded; slow down",
                "rate_limit_error",
                "rate_limited",
                retry_after_s=lim.retry_after_s,
            )
        if lim.max_inflight_requests and self.inflight >= lim.max_inflight_requests:
            self.metrics.rejections.labels("over_capacity").inc()
            raise adm.HttpError(
                429,
                f"router is at its limit of {lim.max_inflight_requests} requests in flight",
                "rate_limit_error",
                "over_capacity",
                retry_after_s=lim.retry_after_s,
            )

    def _model(self, name: str) -> ModelConfig:
        model = self.cfg.model(name)
        if model is None:
            served = [m.name for m in self.cfg.models]
            raise adm.bad_request(
                f"unknown model {name!r}; this router serves {served}", "model", "model_not_found"
            )
        return model

    def _prompt_ids(self, req: ChatRequest | CompletionRequest, tok: Tokenizer) -> list[int]:
        if isinstance(req, ChatRequest):
            limit = self.cfg.http.max_prompt_messages
            if len(req.messages) > limit:
                raise adm.bad_request(f"messages: {len(req.messages)} messages, at most {limit}", "messages")
            msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
            try:
                return tok.chat_ids(msgs)
            except NoChatTemplate as exc:
                raise adm.bad_request(
                    f"model {req.model!r}: {exc}", "messages", "chat_template_missing"
                ) from None
            except Exception as exc:  # a template that refuses the conversation (jinja raise_exception)
                raise adm.bad_request(
                    f"messages: the chat template refused them: {exc}", "messages"
                ) from None
        if isinstance(req.prompt, str):
            return tok.encode(req.prompt)
        if isinstance(req.prompt[0], str):
            return tok.encode(str(req.prompt[0]))
        ids = [int(i) for i in req.prompt]
        if any(i < 0 or i >= tok.vocab_size for i in ids):
            raise adm.bad_request(f"prompt: token ids must be in [0, {tok.vocab_size})", "prompt")
        return ids

    def context_tokens(self, model: ModelConfig) -> int:
        """The model's context: the configured one, lowered to the largest that a live worker reports
        (a request that no worker could hold is malformed, not a capacity problem)."""
        return model_context_tokens(model.name, model.max_context_tokens, self.store.snapshot().workers)

    def _shape(
        self,
        req: ChatRequest | CompletionRequest,
        model: ModelConfig,
        n_prompt: int,
        slo: tuple[float, float],
    ) -> RequestShape:
        ctx = self.context_tokens(model)
        if not fits_context(n_prompt + 1, ctx):  # room for at least one new token
            raise adm.bad_request(
                f"prompt has {n_prompt} tokens; model {model.name!r} accepts at most {ctx - 1} "
                f"(its context is {ctx}); shorten the prompt",
                "prompt",
                "context_length_exceeded",
            )
        asked = req.requested_max_tokens() if isinstance(req, ChatRequest) else req.max_tokens
        if asked is not None and not fits_context(n_prompt + asked, ctx):
            raise adm.bad_request(
                f"prompt ({n_prompt}) + max_tokens ({asked}) exceeds the context of {ctx} tokens; "
                "lower max_tokens",
                "max_tokens",
                "context_length_exceeded",
            )
        max_new = asked if asked is not None else min(model.default_max_tokens, ctx - n_prompt)
        return RequestShape(model.name, n_prompt, max_new, slo[0], slo[1], model.prefill_ms_per_token)

    async def handle(self, request: Request, kind: str) -> Response:
        t_in = time.perf_counter()
        self._admit(request)
        # Counted from admission (not from the first token), so a burst cannot pass the in-flight limit;
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
        data = await adm.read_json(request, self.cfg.http.max_request_bytes)
        field = unsupported_field(data) if isinstance(data, dict) else None
        if field is not None:
            raise adm.bad_request(
                f"{field} is not supported by this server; remove it from the request", field, "unsupported"
            )
        req = adm.parse_model(ChatRequest if kind == "chat" else CompletionRequest, data)
        model = self._model(req.model)
        tok = self.tokenizers[model.name]
        prompt_ids = self._prompt_ids(req, tok)
        shape = self._shape(req, model, len(prompt_ids), adm.slo_from_headers(request, self.cfg))
        stops = [] if req.ignore_eos else list(tok.stop_token_ids)  # EOS and generation_config.json's
        sampling = Sampling(req.temperature, req.top_p, req.top_k, tuple(stops), req.ignore_eos, req.seed)
        op = "chat" if kind == "chat" else "text_completion"
        span = self.tracer.start_span(
            f"{op} {model.name}",
            kind=trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": op,
                "gen_ai.request.model": model.name,
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
            raise adm.HttpError(
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
        relay = Relay(
            stream,
            tok,
            req.stop_strings(),
            len(prompt_ids),
            self.metrics,
            model.name,
            t_in,
            span,
            slo_ms=(shape.slo_ttft_ms, shape.slo_tpot_ms),
        )
        owner.append(relay)
        shape_out = ResponseShape("chat" if kind == "chat" else "text", model.name, uuid.uuid4().hex[:24])
        if req.stream:
            body = stream_sse(relay, shape_out, req.include_usage, self._done)
            headers = {"cache-control": "no-cache", "x-zipkv-worker": stream.worker_id}
            return RelayResponse(relay, self._done, body, headers)
        out = await _collect_unless_gone(request, relay, self._done)
        if out.error:
            self.metrics.rejections.labels("worker_failed").inc()
            return JSONResponse(
                error_body(out.error + "; retry the request", "server_error", 502), status_code=502
            )
        return JSONResponse(
            shape_out.full(out.text, out.finish_reason, out.prompt_tokens, out.completion_tokens),
            headers={"x-zipkv-worker": stream.worker_id},
        )


async def _collect_unless_gone(request: Request, relay: Relay, on_done: Callable[[], None]) -> Outcome:
    """Collect a non-streamed response; if the client goes away first, stop (the worker gets Abort)."""
    task = asyncio.ensure_future(collect(relay, on_done))
    while not task.done():
        await asyncio.wait([task], timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise adm.HttpError(499, "client closed the request", "invalid_request_error", "client_gone")
    return task.result()

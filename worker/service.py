"""The Worker gRPC service (grpc.aio): Generate (server streaming), Abort, Health."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from zipkv.controlplane.grpc_auth import bearer_token, peer_identity, tokens_equal
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine import EngineEvent, EngineRequest, FinishReason, RequestRejected, SamplingOptions
from zipkv.worker.loop import STALLED, EngineLoop
from zipkv.worker.metrics import WorkerMetrics
from zipkv.worker.request_spans import generate_attributes, record_finish
from zipkv.worker.telemetry import parent_context, trace_headers

log = logging.getLogger("zipkv.worker")

_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}


def to_engine_request(msg: pb.GenerateRequest, default_max_new_tokens: int = 16) -> EngineRequest:
    """Convert and validate; raises ValueError with a message meant for the caller."""
    if not msg.request_id:
        raise ValueError("request_id is empty")
    s = msg.sampling
    options = SamplingOptions(
        temperature=s.temperature,
        top_p=s.top_p if s.top_p > 0 else 1.0,  # proto3: 0 means unset
        top_k=s.top_k,
        max_new_tokens=s.max_new_tokens or default_max_new_tokens,
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        seed=s.seed,
    )
    return EngineRequest(msg.request_id, tuple(msg.prompt_token_ids), options)


class WorkerService(pb_grpc.WorkerServicer):
    def __init__(
        self,
        engine_loop: EngineLoop,
        worker_id: str,
        model: str,
        dispatch_token: str = "",
        router_identity: str | None = None,
        tracer: trace.Tracer | None = None,
        metrics: WorkerMetrics | None = None,
        engine_kind: str = "reference",
    ) -> None:
        self.loop = engine_loop
        self.worker_id = worker_id
        self.model = model
        self.draining = False
        self._token = dispatch_token
        self._router_identity = router_identity  # under mutual TLS: the CN the caller must hold
        self.tracer = tracer or trace.NoOpTracer()
        self.metrics = metrics
        self.engine_kind = engine_kind

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        """Generate and Abort come from the router only: its dispatch token and/or its certificate."""
        if self._token and not tokens_equal(bearer_token(context.invocation_metadata()), self._token):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "dispatch token missing or wrong")
        if self._router_identity is not None and peer_identity(context) != self._router_identity:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"only the router's certificate ({self._router_identity!r}) may call this worker",
            )

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        await self._authenticate(context)  # first: only the router's trace context is continued
        # The router's zipkv.dispatch span is the parent (W3C traceparent in the call's metadata).
        span = self.tracer.start_span(
            "zipkv.generate",
            context=parent_context(context.invocation_metadata()),
            kind=trace.SpanKind.SERVER,
            attributes=generate_attributes(request, self.model, self.worker_id, self.engine_kind),
        )
        try:
            events = await self._submit(request, context, trace_headers(span))
            async for msg in self._stream(request, events, span, context):
                yield msg
        except (GeneratorExit, asyncio.CancelledError):
            raise  # the caller went away: _stream marks the span cancelled
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()

    async def _submit(
        self,
        request: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        headers: tuple[tuple[str, str], ...],
    ) -> asyncio.Queue[EngineEvent]:
        if self.draining:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id} is draining: retry elsewhere"
            )
        if not self.loop.alive:
            why = self.loop.trouble() or "engine is not running"
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id}: {why}; retry elsewhere"
            )
        if request.model and request.model != self.model:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not served here (this worker serves {self.model!r})",
            )
        try:
            engine_request = dataclasses.replace(to_engine_request(request), trace_headers=headers)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            return await self.loop.submit(engine_request)
        except RequestRejected as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.retryable else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, str(exc))
        raise AssertionError("unreachable: context.abort raises")

    async def _stream(
        self,
        request: pb.GenerateRequest,
        events: asyncio.Queue[EngineEvent],
        span: trace.Span,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.GenerateResponse]:
        finished = False
        try:
            while True:
                event = await events.get()
                if event is STALLED:
                    await self._fail_stalled(context)
                if event.token_ids:
                    yield pb.GenerateResponse(chunk=pb.TokenChunk(token_ids=list(event.token_ids)))
                if event.finish is not None:
                    finished = True
                    self._finished(event, span)
                    yield pb.GenerateResponse(
                        finish=pb.Finish(
                            reason=_FINISH[event.finish],
                            usage=pb.Usage(
                                prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens
                            ),
                            message=event.message,
                            ttft_ms=event.ttft_ms,
                        )
                    )
                    return
        finally:
            if not finished:  # the caller went away (cancel, deadline): free the request's pages
                self.loop.abort(request.request_id, "cancelled by the caller")
                span.set_attribute("zipkv.cancelled", True)
                log.info("generate cancelled request_id=%s", request.request_id)

    async def _fail_stalled(self, context: grpc.aio.ServicerContext) -> None:
        """The engine stalled (`engine_stall_s`, EngineLoop.watch_stall): the replica is about to be replaced
        (its health check fails), so the call fails with UNAVAILABLE now and its router moves the request to
        another worker, from its tokens so far, rather than when Serve kills this replica (three failed
        health checks and a graceful shutdown later)."""
        why = self.loop.trouble() or "engine stalled"
        log.warning("generate failed: %s; the router moves the request", why)
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id}: {why}; retry elsewhere")

    def _finished(self, event: EngineEvent, span: trace.Span) -> None:
        record_finish(span, self.tracer, event)
        if event.finish is FinishReason.ERROR:
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.message or "engine error"))
        if self.metrics is not None:
            self.metrics.observe_finish(event)

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        await self._authenticate(context)
        found = self.loop.has_stream(request.request_id)
        if found:
            self.loop.abort(request.request_id, "aborted by the router")
        return pb.AbortResponse(found=found)

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(
            serving=self.loop.alive and not self.draining,
            draining=self.draining,
            worker_id=self.worker_id,
            model=self.model,
        )

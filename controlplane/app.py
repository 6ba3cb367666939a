"""The router's HTTP API (FastAPI): OpenAI-compatible completions, models, health, metrics.

`build_app(config)` returns the ASGI app; its lifespan starts the ControlPlane gRPC report server and
the shared-state refresher. `zipkv.controlplane.server.serve(config)` runs it under uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from zipkv.controlplane import gate
from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.openai_api import error_body
from zipkv.controlplane.openapi_schema import COMPLETION_ROUTES
from zipkv.controlplane.openapi_schema import install as install_openapi
from zipkv.controlplane.readiness import readiness
from zipkv.controlplane.reports import ReportServicer, start_report_server
from zipkv.controlplane.router import Router, make_store
from zipkv.controlplane.state import Store
from zipkv.controlplane.telemetry import make_tracer_provider

__all__ = ["Router", "build_app"]

log = logging.getLogger("zipkv.controlplane")


def _error_response(exc: gate.HttpError) -> JSONResponse:
    headers = {"retry-after": str(exc.retry_after_s)} if exc.retry_after_s else None
    return JSONResponse(
        error_body(exc.message, exc.type, exc.code, exc.param), status_code=exc.status, headers=headers
    )


ROUTES = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /healthz, /readyz, /metrics"


def _routing_http_error(request: Request, exc: StarletteHTTPException) -> gate.HttpError:
    """404 / 405 (and any other error the framework raises) in the OpenAI error shape."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        return gate.HttpError(
            404, f"no route {where}; this server has {ROUTES}", "invalid_request_error", "not_found"
        )
    if exc.status_code == 405:
        allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "")
        return gate.HttpError(
            405, f"{where}: method not allowed (use {allowed})", "invalid_request_error", "method_not_allowed"
        )
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return gate.HttpError(exc.status_code, f"{where}: {exc.detail}", kind, "http_error")


def build_app(
    cfg: RouterConfig, *, store: Store | None = None, tracer_provider: trace.TracerProvider | None = None
) -> FastAPI:
    """The router as an ASGI app. Its lifespan serves ControlPlane reports on cfg.grpc."""
    provider = tracer_provider or make_tracer_provider(cfg.telemetry)
    router = Router(cfg, store or make_store(cfg), provider)
    # A provider made here is this app's to shut down; one passed in stays the caller's.
    own_provider = provider if tracer_provider is None else None
    lifespan = _lifespan(router, own_provider)
    app = FastAPI(title="zipkv router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.router = router
    install_openapi(app, [m.name for m in cfg.models])
    _install_error_handlers(app, router)
    _install_routes(app, router)
    return app


def _lifespan(
    router: Router, own_provider: trace.TracerProvider | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start: the report server and the shared-state refresher. Stop: them, the dispatcher, the store and
    a tracer provider of the app's own, in that order."""
    cfg = router.cfg

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        servicer = ReportServicer(cfg, router.store, router.metrics)
        tls = cfg.security.tls.files() if cfg.security.tls else None
        server, router.report_port = await start_report_server(servicer, cfg.grpc.host, cfg.grpc.port, tls)
        runner = getattr(router.store, "run", None)
        refresher = asyncio.create_task(runner()) if runner is not None else None
        log.info("router up", extra={"report_port": router.report_port, "state": cfg.state.backend})
        try:
            yield
        finally:
            log.info("router stopping")
            if refresher is not None:
                # The flag ends the loop even if a client library swallows the cancellation.
                getattr(router.store, "stop", lambda: None)()
                refresher.cancel()
                await asyncio.wait({refresher}, timeout=2.0)
            await server.stop(1.0)
            log.info("report server stopped")
            await router.dispatcher.close()
            closer = getattr(router.store, "close", None)
            if closer is not None:
                await closer()
            if isinstance(own_provider, TracerProvider):
                own_provider.shutdown()
            log.info("router stopped")

    return lifespan


def _install_error_handlers(app: FastAPI, router: Router) -> None:
    """Every error in the OpenAI error shape: ours, the framework's (404, 405), and the unexpected."""

    @app.exception_handler(gate.HttpError)
    async def _http_error(request: Request, exc: gate.HttpError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _error_response(_routing_http_error(request, exc))
        response.headers.update(exc.headers or {})  # e.g. Allow on a 405
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The id ties the client's error to the log line with the stack trace (the router's stderr, JSON
        # lines; `zipkv up` writes it to the router log it names at start-up).
        error_id = uuid.uuid4().hex[:16]
        log.exception("unexpected error", extra={"path": request.url.path, "error_id": error_id})
        router.metrics.rejections.labels("internal").inc()
        message = (
            f"internal error in the router (error_id {error_id}); the router's log has the details under "
            "that id: retry, and report it if it persists"
        )
        return JSONResponse(error_body(message, "server_error", 500), status_code=500)


class _Completions:
    """POST /v1/completions or /v1/chat/completions as a plain ASGI endpoint (a Starlette Route).

    The handlers read and check their body themselves (gate.py), so FastAPI's per-request endpoint
    machinery (dependency solving, two exit stacks, response serialisation) had nothing to do for them, yet
    it cost about a third of a millisecond of router CPU per request (bench/router/bench_gateway.py).
    The app's middleware and exception handlers still wrap this route: errors keep the OpenAI shape, a
    wrong method still gets 405 with Allow. openapi_schema.py describes both routes."""

    def __init__(self, router: Router, kind: str) -> None:
        self.router, self.kind = router, kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.router.handle(Request(scope, receive, send), self.kind)
        await response(scope, receive, send)


def _install_routes(app: FastAPI, router: Router) -> None:
    """The routes of ROUTES."""
    cfg = router.cfg
    for path, kind in COMPLETION_ROUTES.items():
        # Starlette serves a non-function endpoint as an ASGI app; its stub types endpoints as functions.
        endpoint: Any = _Completions(router, kind)
        app.add_route(path, endpoint, methods=["POST"], include_in_schema=False)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        router.check_key(request)
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": 0,
                "owned_by": "zipkv",
                "max_model_len": m.max_context_tokens,
            }
            for m in cfg.models
        ]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        # Degraded still serves (200, the states named); no worker for a model is not ready (503).
        code, body = readiness(router.store.snapshot(), cfg, router.dispatcher.clock(), router.inflight)
        return JSONResponse(body, status_code=code)

    @app.get("/metrics")
    async def metrics() -> Response:
        router.metrics.observe_snapshot(router.store.snapshot())
        return Response(router.metrics.render(), media_type=CONTENT_TYPE_LATEST)

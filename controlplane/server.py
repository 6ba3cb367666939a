"""Run the router: `serve(config)` (a coroutine, for `python -m zipkv.controlplane` and `zipkv up`) and
`running_router(config)` (an async context manager that starts it in-process and reports its ports)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from zipkv.controlplane.app import Router, build_app
from zipkv.controlplane.config import RouterConfig


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the `extra` fields a log call passed."""

    _skip = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("zipkv")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _uvicorn(app: FastAPI, cfg: RouterConfig, port: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=cfg.http.host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)


async def serve(cfg: RouterConfig, app: FastAPI | None = None) -> None:
    """Serve HTTP on cfg.http and reports on cfg.grpc until cancelled or signalled."""
    server = _uvicorn(app or build_app(cfg), cfg, cfg.http.port)
    await server.serve()


@dataclass(frozen=True)
class RunningRouter:
    http_url: str
    report_address: str
    router: Router


@contextlib.asynccontextmanager
async def running_router(cfg: RouterConfig, app: FastAPI | None = None) -> AsyncIterator[RunningRouter]:
    """Start the router in this event loop (ports from cfg; 0 picks free ones) and stop it on exit."""
    app = app or build_app(cfg)
    server = _uvicorn(app, cfg, cfg.http.port)
    server.config.install_signal_handlers = False  # type: ignore[attr-defined]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # start-up failed: raise why
            raise RuntimeError("router HTTP server exited during start-up")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    host = "127.0.0.1" if cfg.http.host in ("0.0.0.0", "::", "") else cfg.http.host
    router: Router = app.state.router
    try:
        yield RunningRouter(f"http://{host}:{port}", f"127.0.0.1:{router.report_port}", router)
    finally:
        server.should_exit = True
        await task

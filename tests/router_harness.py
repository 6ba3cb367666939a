"""Test harness: the router and scripted workers (stand-ins for GPU workers) on one background
event loop, real HTTP and real gRPC on loopback; tests talk to them from the main thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.server import RunningRouter, running_router
from zipkv.protos import zipkv_pb2 as pb
from zipkv.testing.scripted_worker import Script, ScriptedWorker, report_forever, send_report

T = TypeVar("T")


TOKEN = "test-report-token"
MODEL = "zipkv-tiny"


def make_config(**sections: Any) -> RouterConfig:
    data: dict[str, Any] = {
        "http": {"host": "127.0.0.1", "port": 0},
        "grpc": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": MODEL, "tokenizer": "byte", "max_context_tokens": 4096}],
        "security": {"report_token": TOKEN},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return RouterConfig.model_validate(data)


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Stack:
    """One router (in-process) plus scripted workers that report to it."""

    def __init__(self, loop: LoopThread, cfg: RouterConfig, **app_kwargs: Any) -> None:
        from zipkv.controlplane.app import build_app

        self.loop, self.cfg = loop, cfg
        self.app = loop.run(_build(cfg, app_kwargs, build_app))
        self._cm = running_router(cfg, self.app)
        self.router: RunningRouter = loop.run(self._cm.__aenter__())
        self.url = self.router.http_url
        self.workers: list[ScriptedWorker] = []
        self._reporting: list[Any] = []

    def keep_reporting(self, worker: ScriptedWorker, period_s: float = 0.2) -> None:
        """Report `worker` every period_s until close, like a real worker: a module-scoped stack then
        keeps its worker placeable however long the module's tests take (reports expire after 5 s)."""
        coro = report_forever(worker, self.router.report_address, TOKEN, period_s)
        self._reporting.append(asyncio.run_coroutine_threadsafe(coro, self.loop.loop))

    def add_worker(self, script: Script | None = None, report: bool = True, **kw: Any) -> ScriptedWorker:
        worker = ScriptedWorker(script=script, **kw)
        self.loop.run(worker.start())
        self.workers.append(worker)
        if report:
            ack = self.report(worker)
            assert ack.accepted, ack.reason
        return worker

    def report(self, worker: ScriptedWorker, token: str = TOKEN, **overrides: Any) -> pb.ReportAck:
        return self.loop.run(send_report(self.router.report_address, worker.report(**overrides), token))

    def send(self, report: pb.CapacityReport, token: str = TOKEN) -> pb.ReportAck:
        return self.loop.run(send_report(self.router.report_address, report, token))

    def close(self) -> None:
        for task in self._reporting:
            task.cancel()
        with contextlib.suppress(Exception):
            self.loop.run(self._cm.__aexit__(None, None, None))
        for w in self.workers:
            with contextlib.suppress(Exception):
                self.loop.run(w.stop(0))


async def _build(cfg: RouterConfig, kwargs: dict[str, Any], build_app: Any) -> Any:
    return build_app(cfg, **kwargs)  # built on the loop so its gRPC objects bind to it


@contextlib.contextmanager
def stack(**sections: Any) -> Iterator[Stack]:
    loop = LoopThread()
    app_kwargs = sections.pop("app_kwargs", {})
    s = Stack(loop, make_config(**sections), **app_kwargs)
    try:
        yield s
    finally:
        s.close()
        loop.close()

"""One worker: an engine, its loop thread, the Worker gRPC server and the capacity reporter.

The runtime runs its own asyncio loop on its own thread, so it works the same inside a Ray Serve replica,
in a plain process, and in tests. `start()` returns once the server listens; `drain()` is the graceful
shutdown: stop admitting (new Generate calls get UNAVAILABLE), report `draining`, let running requests
finish up to a timeout, abort the rest with a clear message, then stop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from typing import Any

import grpc
from opentelemetry.sdk.trace import TracerProvider

from zipkv.controlplane import grpc_keepalive as keepalive
from zipkv.controlplane.grpc_auth import EXCLUSIVE_PORT, add_port, warn_plaintext
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine import Engine
from zipkv.worker.loop import EngineLoop
from zipkv.worker.metrics import WorkerMetrics
from zipkv.worker.reporter import CapacityReporter
from zipkv.worker.service import WorkerService
from zipkv.worker.settings import WorkerSettings
from zipkv.worker.telemetry import TRACER_NAME, make_tracer_provider

log = logging.getLogger("zipkv.worker")


class WorkerRuntime:
    service: WorkerService  # set in __init__; the metrics read its draining flag through a lambda first

    def __init__(
        self,
        engine: Engine,
        settings: WorkerSettings,
        worker_id: str | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tracer_provider``: where the worker's spans go (default: from the OTEL_* variables; the
        runtime then owns it and flushes it when it stops)."""
        self.engine = engine
        self.settings = settings
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self.address = ""
        self.metrics_address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zipkv-worker-io", daemon=True)
        self.engine_loop = EngineLoop(engine, self._loop, stall_after_s=settings.engine_stall_s)
        tls = settings.tls_files()
        self._own_provider = tracer_provider is None
        self.tracer_provider = tracer_provider or make_tracer_provider(self.worker_id)
        self.metrics = WorkerMetrics(
            self.worker_id,
            engine.model_name,
            self.engine_loop.kv_stats,
            self.engine_loop.capacity,
            lambda: self.service.draining,
            self.engine_loop.silent_s,
        )
        self.service = WorkerService(
            self.engine_loop,
            self.worker_id,
            engine.model_name,
            dispatch_token=settings.dispatch_token,
            router_identity=tls.peer_name if tls else None,
            tracer=self.tracer_provider.get_tracer(TRACER_NAME),
            metrics=self.metrics,
            engine_kind=settings.engine,
        )
        self.reporters: list[CapacityReporter] = []
        self._server: grpc.aio.Server | None = None
        self.stopped = False

    # ---- life cycle ---------------------------------------------------------------------------------
    def start(self) -> str:
        """Start serving; returns the address the router dials (host:port)."""
        self._thread.start()
        self.engine_loop.start()
        asyncio.run_coroutine_threadsafe(self.engine_loop.watch_stall(), self._loop)
        self._call(self._start_server())
        s = self.settings
        if s.metrics_port >= 0:
            port = self.metrics.serve(s.bind_host, s.metrics_port, s.metrics_ports)
            self.metrics_address = f"{s.advertise_host or s.bind_host}:{port}"
        log.info(
            "worker ready worker_id=%s address=%s model=%s router=%s metrics=%s",
            self.worker_id,
            self.address,
            self.engine.model_name,
            s.router_address or "-",
            f"http://{self.metrics_address}/metrics" if self.metrics_address else "off",
        )
        return self.address

    async def _start_server(self) -> None:
        self.settings.check_serving_credentials()
        tls = self.settings.tls_files()
        server = grpc.aio.server(options=[EXCLUSIVE_PORT, *keepalive.SERVER_OPTIONS])
        pb_grpc.add_WorkerServicer_to_server(self.service, server)
        where = f"{self.settings.bind_host}:{self.settings.port}"
        if tls is None:
            auth = "dispatch token" if self.settings.dispatch_token else "NO credentials (loopback only)"
            warn_plaintext(f"worker {self.worker_id} on {where}, Generate checked by {auth}")
        port = add_port(server, where, tls)
        if port == 0:
            raise RuntimeError(
                f"could not listen on {self.settings.bind_host}:{self.settings.port}: is it in use?"
            )
        await server.start()
        self._server = server
        self.address = f"{self.settings.advertise_host or self.settings.bind_host}:{port}"
        epoch = time.time_ns()
        for router in self.settings.report_addresses():
            reporter = CapacityReporter(
                router,
                self.settings.report_token,
                self.worker_id,
                self.address,
                self.engine.model_name,
                capacity=self.engine_loop.capacity,
                # a stuck engine reports draining: routers stop placing on it until Serve replaces it
                draining=lambda: self.service.draining or not self.engine_loop.alive,
                interval_ms=self.settings.report_interval_ms,
                tls=tls,
                epoch=epoch,
            )
            await reporter.report_once()
            reporter.start()
            self.reporters.append(reporter)

    def healthy(self) -> bool:
        return not self.stopped and self.engine_loop.alive and self._thread.is_alive()

    def drain(self, timeout_s: float | None = None) -> int:
        """Graceful shutdown; returns how many requests had to be aborted."""
        if self.stopped:
            return 0
        timeout_s = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        self.service.draining = True
        log.info("worker draining worker_id=%s inflight=%d", self.worker_id, self.engine_loop.inflight())
        for reporter in self.reporters:
            self._call(reporter.report_once())
        deadline = time.monotonic() + timeout_s
        while self.engine_loop.inflight() and time.monotonic() < deadline:
            time.sleep(0.05)
        aborted = self.engine_loop.inflight()
        for rid in self.engine_loop.stream_ids():
            self.engine_loop.abort(rid, f"worker {self.worker_id} is shutting down: retry the request")
        deadline = time.monotonic() + 5.0
        while self.engine_loop.inflight() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.stop()
        log.info("worker stopped worker_id=%s aborted=%d", self.worker_id, aborted)
        return aborted

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            self._call(self._stop_server(), timeout_s=10.0)
        finally:
            self.engine_loop.stop()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            self.metrics.stop()
            if self._own_provider:
                self.tracer_provider.shutdown()  # exports the spans still batched

    async def _stop_server(self) -> None:
        for reporter in self.reporters:
            await reporter.stop()
        if self._server is not None:
            await self._server.stop(grace=1.0)

    def _call(self, coro: Any, timeout_s: float = 30.0) -> Any:
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout_s)

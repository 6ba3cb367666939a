"""One request's trace from the HTTP edge to the engine step, on the CPU, as an OTLP collector receives it.

    python -m bench.serving.trace_capture --out bench/results/trace_cpu.json

An OTLP/gRPC collector endpoint runs in this process (`OtlpReceiver`: opentelemetry-proto's
TraceService over real gRPC, keeping every span it is sent). The router (in-process, exporting by its
`telemetry.otlp_endpoint` setting) and one worker runtime (the reference engine, the tiny model, on the
CPU, exporting by the standard OTEL_EXPORTER_OTLP_ENDPOINT) both export to it; one streamed completion
goes through the router's HTTP API; both tracer providers are shut down (which flushes them) and the
spans are returned, and written with the run's details by the command line. tests/worker/test_request_trace.py
checks the trace; `python -m bench.plots` draws the file as a timeline for docs/observability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc
from opentelemetry.proto.common.v1 import common_pb2

from zipkv.controlplane.grpc_auth import EXCLUSIVE_PORT

TOKEN = "trace-capture-token"
MODEL = "zipkv-tiny"


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver(tgrpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector endpoint on loopback that keeps what it receives, as plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[EXCLUSIVE_PORT])
        tgrpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def Export(self, request: tpb.ExportTraceServiceRequest, context: Any) -> tpb.ExportTraceServiceResponse:
        got: list[dict[str, Any]] = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                got.extend(_span(sp, resource) for sp in ss.spans)
        with self._lock:
            self.spans.extend(got)
        return tpb.ExportTraceServiceResponse()

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


def _span(sp: Any, resource: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": sp.name,
        "service": resource.get("service.name", ""),
        "trace_id": sp.trace_id.hex(),
        "span_id": sp.span_id.hex(),
        "parent_span_id": sp.parent_span_id.hex(),
        "kind": sp.kind,
        "start_ns": sp.start_time_unix_nano,
        "end_ns": sp.end_time_unix_nano,
        "status": sp.status.code,
        "attributes": {a.key: _value(a.value) for a in sp.attributes},
    }


def capture(
    receiver: OtlpReceiver, prompt: str = "zipkv traces a request", max_tokens: int = 24
) -> dict[str, Any]:
    """Run one streamed completion through a router and a reference-engine worker exporting to
    `receiver`; returns what the client saw. The spans are in `receiver.spans` afterwards."""
    from zipkv.worker.engine_factory import build_engine
    from zipkv.worker.runtime import WorkerRuntime
    from zipkv.worker.settings import WorkerSettings
    from zipkv.worker.telemetry import make_tracer_provider

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        cm, router = _start_router(loop, receiver.endpoint)
        settings = WorkerSettings(
            router_address=router.report_address, report_token=TOKEN, report_interval_ms=100
        )
        provider = make_tracer_provider("w-trace", env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        worker = WorkerRuntime(
            build_engine(settings), settings, worker_id="w-trace", tracer_provider=provider
        )
        worker.start()
        try:
            seen = _one_request(router.http_url, prompt, max_tokens)
        finally:
            worker.stop()
            provider.shutdown()  # flushes the worker's spans
            asyncio.run_coroutine_threadsafe(cm.__aexit__(None, None, None), loop).result(
                30
            )  # and the router's
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    return seen


def _start_router(loop: asyncio.AbstractEventLoop, otlp_endpoint: str) -> tuple[Any, Any]:
    from zipkv.controlplane.app import build_app
    from zipkv.controlplane.config import RouterConfig
    from zipkv.controlplane.server import running_router

    cfg = RouterConfig.model_validate(
        {
            "http": {"host": "127.0.0.1", "port": 0},
            "grpc": {"host": "127.0.0.1", "port": 0},
            "models": [{"name": MODEL, "tokenizer": "byte"}],
            "security": {"report_token": TOKEN},
            "telemetry": {"otlp_endpoint": otlp_endpoint},
        }
    )

    async def start() -> tuple[Any, Any]:
        cm = running_router(cfg, build_app(cfg))
        return cm, await cm.__aenter__()

    return asyncio.run_coroutine_threadsafe(start(), loop).result(30)


def _one_request(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/readyz").json().get("workers", 0) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not report to the router within 30 s")
        time.sleep(0.05)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    chunks = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        r.raise_for_status()
        worker = r.headers.get("x-zipkv-worker", "")
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
    return {
        "worker": worker,
        "chunks": chunks,
        "prompt_bytes": len(prompt.encode()),
        "max_tokens": max_tokens,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/trace_cpu.json"))
    args = ap.parse_args()
    receiver = OtlpReceiver().start()
    try:
        seen = capture(receiver)
    finally:
        receiver.stop()
    spans = sorted(receiver.spans, key=lambda s: (s["start_ns"], s["name"]))
    out = {
        "what": "one streamed completion through the router and a reference-engine worker (tiny model, CPU)",
        "command": "python -m bench.serving.trace_capture --out " + str(args.out),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} CPU, Python {platform.python_version()}",
        "request": seen,
        "spans": spans,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(spans)} spans in {len({s['trace_id'] for s in spans})} trace(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""OTLP export to a real OTLP/gRPC receiver on loopback, turned on by the standard OTEL_* variable; the
stale-report counter; non-streamed requests abort the worker when the client goes away."""

from __future__ import annotations

import re
import time
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc
from router_harness import MODEL, stack
from servers import free_port

from zipkv.testing.scripted_worker import Script


class Receiver(tgrpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, str | int]]] = []

    def Export(
        self, request: tpb.ExportTraceServiceRequest, context: object
    ) -> tpb.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    attrs = {a.key: a.value.string_value or a.value.int_value for a in sp.attributes}
                    self.spans.append((sp.name, attrs))
        return tpb.ExportTraceServiceResponse()


def test_otlp_export_from_standard_env(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    tgrpc.add_TraceServiceServicer_to_server(receiver, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        with stack() as s:
            s.add_worker()
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
            assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        # Leaving the stack shut the tracer provider down, which flushes the batch to the receiver.
        names = {name for name, _ in receiver.spans}
        assert {f"text_completion {MODEL}", "zipkv.placement", "zipkv.dispatch"} <= names
        attrs = next(a for n, a in receiver.spans if n.startswith("text_completion"))
        assert attrs["gen_ai.request.model"] == MODEL
        assert attrs["gen_ai.usage.output_tokens"] == 3
    finally:
        server.stop(0)


def test_stale_reports_are_counted_and_compared_coarsely() -> None:
    with stack(placement={"stale_after_ms": 600, "expire_after_ms": 5000}) as s:
        w = s.add_worker()
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        assert s.report(w).accepted  # fresh now
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        time.sleep(0.7)  # no report since: stale, not yet expired
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        metrics = httpx.get(s.url + "/metrics").text
        assert "zipkv_router_stale_reports_total 1.0" in metrics
        for mode in ("fine", "coarse"):
            assert re.search(rf'zipkv_router_placements_total{{mode="{mode}",worker="[^"]+"}} 1\.0', metrics)


def test_non_streamed_request_aborts_when_the_client_leaves() -> None:
    with stack() as s:
        w = s.add_worker(Script(itl_s=0.02))
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2000}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/v1/completions", json=body, timeout=0.3)
        deadline = time.monotonic() + 5
        while not (w.seen.aborted and not w.running and s.router.router.inflight == 0):
            assert time.monotonic() < deadline, "the worker's request was not aborted"
            time.sleep(0.05)
        assert w.seen.aborted == [w.seen.requests[0].request_id]


def test_too_many_messages_is_400() -> None:
    with stack(http={"max_prompt_messages": 2}) as s:
        s.add_worker()
        msgs = [{"role": "user", "content": "a"}] * 3
        r = httpx.post(s.url + "/v1/chat/completions", json={"model": MODEL, "messages": msgs})
        assert r.status_code == 400 and "at most 2" in r.json()["error"]["message"]


def test_goodput_counts_requests_against_their_slos() -> None:
    """zipkv_router_slo_requests_total{outcome}: met, or which SLO was missed (the headers override the
    configured targets); the dashboard's goodput is the met share."""
    with stack() as s:
        s.add_worker(Script(ttft_s=0.15, itl_s=0.03))  # first token after ~150 ms, then one per ~30 ms
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": True}

        def send(ttft_ms: float, tpot_ms: float) -> None:
            headers = {"x-zipkv-slo-ttft-ms": str(ttft_ms), "x-zipkv-slo-tpot-ms": str(tpot_ms)}
            with httpx.stream("POST", s.url + "/v1/completions", json=body, headers=headers) as r:
                assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())

        send(5000, 1000)  # met
        send(50, 1000)  # first token too late
        send(5000, 5)  # tokens too slow
        send(5000, 1000)  # met
        metrics = httpx.get(s.url + "/metrics").text
    counts = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            rf'zipkv_router_slo_requests_total{{model="{MODEL}",outcome="(\w+)"}} ([0-9.]+)', metrics
        )
    }
    assert counts == {"met": 2.0, "ttft_missed": 1.0, "tpot_missed": 1.0}

"""Dispatch over real gRPC to scripted workers (stand-ins for GPU workers): retry once before the first
token, clear errors after it, Abort on client disconnect, reservations always released, trace context."""

from __future__ import annotations

import time

import grpc
import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from router_harness import MODEL, Stack, stack

from zipkv.testing.scripted_worker import Script

BODY = {"model": MODEL, "prompt": "x", "max_tokens": 4}


def reserved(s: Stack) -> int:
    store = s.router.router.store
    return sum(store.reserved_total(w.worker_id) for w in s.workers)  # type: ignore[attr-defined]


def wait_for(cond: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
def test_refusal_is_retried_once_on_the_next_best_worker(code: grpc.StatusCode) -> None:
    with stack() as s:
        refuser = s.add_worker(Script(refuse=code), total_tokens=200_000)  # most headroom: tried first
        good = s.add_worker(total_tokens=100_000)
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hell"
        assert r.headers["x-zipkv-worker"] == good.worker_id
        assert len(refuser.seen.requests) == 1 and len(good.seen.requests) == 1
        metrics = httpx.get(s.url + "/metrics").text
        assert f'zipkv_router_retries_total{{reason="{code.name.lower()}"}} 1.0' in metrics
        assert reserved(s) == 0


def test_unreachable_worker_is_retried() -> None:
    with stack() as s:
        dead = s.add_worker(total_tokens=200_000)
        good = s.add_worker(total_tokens=100_000)  # before the stop, so it cannot take the freed port
        s.loop.run(dead.stop(0))  # its last report is still fresh
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 200 and r.headers["x-zipkv-worker"] == good.worker_id
        assert reserved(s) == 0


def test_only_one_retry_then_503() -> None:
    with stack() as s:
        workers = [s.add_worker(Script(refuse=grpc.StatusCode.RESOURCE_EXHAUSTED)) for _ in range(3)]
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "refused" in r.json()["error"]["message"]
        assert sum(len(w.seen.requests) for w in workers) == 2  # first choice + one retry
        assert reserved(s) == 0


def test_worker_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    with stack() as s:
        s.add_worker(Script(die_after_tokens=3))
        body = {**BODY, "max_tokens": 10, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line]
        assert r.status_code == 200
        assert len(events) == 4 and "[DONE]" not in events[-1]
        assert '"error"' in events[-1] and "failed mid-stream: UNAVAILABLE" in events[-1]
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            list(c.completions.create(model=MODEL, prompt="x", max_tokens=10, stream=True))
        r2 = httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 10})
        assert r2.status_code == 502 and "failed mid-stream" in r2.json()["error"]["message"]
        assert reserved(s) == 0
        assert "zipkv_router_stream_errors_total 3.0" in httpx.get(s.url + "/metrics").text


def test_client_disconnect_aborts_the_worker_request() -> None:
    with stack() as s:
        w = s.add_worker(Script(itl_s=0.02))
        body = {**BODY, "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            assert reserved(s) > 0
        wait_for(lambda: len(w.seen.aborted) == 1)
        assert w.seen.aborted[0] == w.seen.requests[0].request_id
        wait_for(lambda: reserved(s) == 0 and s.router.router.inflight == 0)
        wait_for(lambda: not w.running)  # the worker's request is gone, not generating into the void


def test_slo_headers_steer_placement() -> None:
    with stack() as s:
        # "roomy": all of 200k tokens free, 90 ms decode step. "quick": half of 120k free, 5 ms step.
        # Loose TPOT SLO: slack ~1 on both; headroom 1.0 vs 0.5 decides -> roomy (.98 vs .80).
        # TPOT SLO 95 ms: roomy's slack (95 - 90) / 95 = .05 -> (1 + .05 + .5) / 2.5 = .62;
        # quick's ~.95 -> (.5 + .95 + .5) / 2.5 = .78 -> quick.
        roomy = s.add_worker(total_tokens=200_000, report=False)
        quick = s.add_worker(total_tokens=120_000, report=False)
        assert s.report(roomy, itl_ms=90.0).accepted
        assert s.report(quick, itl_ms=5.0, headroom_tokens=60_000).accepted
        loose = httpx.post(s.url + "/v1/completions", json=BODY, headers={"x-zipkv-slo-tpot-ms": "100000"})
        tight = httpx.post(s.url + "/v1/completions", json=BODY, headers={"x-zipkv-slo-tpot-ms": "95"})
        assert loose.headers["x-zipkv-worker"] == roomy.worker_id
        assert tight.headers["x-zipkv-worker"] == quick.worker_id


def test_trace_context_and_genai_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with stack(app_kwargs={"tracer_provider": provider}) as s:
        w = s.add_worker()
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(s.url + "/v1/chat/completions", json=chat)
        assert r.status_code == 200
        wait_for(lambda: any(sp.name == f"chat {MODEL}" for sp in exporter.get_finished_spans()))
    spans = {sp.name: sp for sp in exporter.get_finished_spans()}
    root, placement, dispatch = spans[f"chat {MODEL}"], spans["zipkv.placement"], spans["zipkv.dispatch"]
    attrs = root.attributes or {}
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.usage.input_tokens"] == 21 and attrs["gen_ai.usage.output_tokens"] == 3
    assert placement.parent is not None and placement.parent.span_id == root.context.span_id
    assert dispatch.parent is not None and dispatch.parent.span_id == root.context.span_id
    traceparent = w.seen.metadata[0]["traceparent"]
    assert traceparent.split("-")[1] == f"{root.context.trace_id:032x}"
    assert traceparent.split("-")[2] == f"{dispatch.context.span_id:016x}"


def test_stream_released_when_the_client_leaves_before_the_headers() -> None:
    import asyncio

    from opentelemetry.trace import NonRecordingSpan, SpanContext

    from zipkv.controlplane.metrics import RouterMetrics
    from zipkv.controlplane.relay import Relay, RelayResponse
    from zipkv.controlplane.tokenizer import ByteTokenizer

    closed: list[bool] = []
    done: list[bool] = []

    class FakeStream:  # stands in for a dispatched Stream: only close() matters here
        worker_id = "w"

        async def close(self) -> None:
            closed.append(True)

    async def body():  # type: ignore[no-untyped-def]
        yield b"data: x\n\n"

    async def send(message: object) -> None:
        raise OSError("client went away")

    async def receive() -> dict[str, str]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        span = NonRecordingSpan(SpanContext(0, 0, False))
        relay = Relay(FakeStream(), ByteTokenizer(), [], 1, RouterMetrics(), MODEL, 0.0, span)  # type: ignore[arg-type]
        resp = RelayResponse(relay, lambda: done.append(True), body(), {})
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "extensions": {}}
        with pytest.raises(BaseException):  # noqa: B017 (whatever the server sees, cleanup must run)
            await resp(scope, receive, send)
        await relay.finish(lambda: done.append(True))  # idempotent: a second call does nothing

    asyncio.run(scenario())
    assert closed == [True] and done == [True]


def test_deadline_before_the_first_token_is_504() -> None:
    with stack(dispatch={"deadline_s": 0.3}) as s:
        s.add_worker(Script(ttft_s=2.0))
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 504 and "DEADLINE_EXCEEDED" in r.json()["error"]["message"]
        assert reserved(s) == 0

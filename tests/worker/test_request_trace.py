"""One request through the router and a real worker (reference engine, tiny model, CPU) yields one trace,
as an OTLP/gRPC collector endpoint (in-process, opentelemetry-proto's TraceService over real gRPC)
receives it: the worker's spans are children of the router's dispatch span and carry the GenAI
attributes; the phases nest inside the Generate span in time order."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bench.serving.trace_capture import MODEL, OtlpReceiver, capture

PROMPT = "zipkv traces a request"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def trace() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    receiver = OtlpReceiver().start()
    try:
        seen = capture(receiver, PROMPT, MAX_TOKENS)
    finally:
        receiver.stop()
    return receiver.spans, seen


def by_name(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    names = [s["name"] for s in spans]
    assert len(names) == len(set(names)), f"one span of each name expected: {names}"
    return {s["name"]: s for s in spans}


def test_one_trace_spans_router_and_worker(trace: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    spans, seen = trace
    assert {s["trace_id"] for s in spans} == {spans[0]["trace_id"]}, "every span in one trace"
    s = by_name(spans)
    root = s[f"text_completion {MODEL}"]
    assert root["parent_span_id"] == "" and root["service"] == "zipkv-router"
    assert s["zipkv.dispatch"]["parent_span_id"] == root["span_id"]
    generate = s["zipkv.generate"]
    assert generate["service"] == "zipkv-worker"
    assert generate["parent_span_id"] == s["zipkv.dispatch"]["span_id"], "the worker continues the router's"
    assert generate["kind"] == 2  # SPAN_KIND_SERVER
    for phase in ("zipkv.queue", "zipkv.admission", "zipkv.prefill", "zipkv.decode"):
        assert s[phase]["service"] == "zipkv-worker"
        assert s[phase]["parent_span_id"] == generate["span_id"], phase
    assert seen["worker"] == generate["attributes"]["zipkv.worker.id"] == "w-trace"


def test_worker_spans_carry_genai_and_engine_attributes(
    trace: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    s = by_name(trace[0])
    prompt_tokens = len(PROMPT.encode()) + 1  # byte tokens and BOS
    g = s["zipkv.generate"]["attributes"]
    assert g["gen_ai.operation.name"] == "text_completion"
    assert g["gen_ai.request.model"] == MODEL
    assert g["gen_ai.request.max_tokens"] == MAX_TOKENS
    assert g["gen_ai.usage.input_tokens"] == prompt_tokens
    assert g["gen_ai.usage.output_tokens"] == MAX_TOKENS
    assert g["gen_ai.response.finish_reasons"] == ["length"]
    assert g["zipkv.engine"] == "reference"
    router = s[f"text_completion {MODEL}"]["attributes"]
    assert router["gen_ai.usage.output_tokens"] == g["gen_ai.usage.output_tokens"]
    prefill = s["zipkv.prefill"]["attributes"]
    assert (
        prefill["zipkv.prefill.tokens"] == prompt_tokens and prefill["zipkv.prefill.prefix_hit_tokens"] == 0
    )
    decode = s["zipkv.decode"]["attributes"]
    # The prefill step makes the first token; each decode step one more.
    assert decode["zipkv.decode.tokens"] == decode["zipkv.decode.steps"] == MAX_TOKENS - 1
    admission = s["zipkv.admission"]["attributes"]
    # The worst case reserved at raw size: prompt + max_tokens rounded up to whole 16-token pages.
    assert admission["zipkv.admission.reserved_tokens"] == -(-(prompt_tokens + MAX_TOKENS) // 16) * 16
    assert admission["zipkv.admission.headroom_tokens"] >= admission["zipkv.admission.reserved_tokens"]


def test_phases_nest_in_time_order(trace: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    s = by_name(trace[0])
    g = s["zipkv.generate"]
    order = ["zipkv.queue", "zipkv.admission", "zipkv.prefill", "zipkv.decode"]
    for name in order:
        assert g["start_ns"] <= s[name]["start_ns"] <= s[name]["end_ns"] <= g["end_ns"], name
    for before, after in itertools.pairwise(order):
        assert s[before]["end_ns"] <= s[after]["start_ns"], (before, after)
    assert s["zipkv.dispatch"]["start_ns"] <= g["start_ns"]

"""A request's spans inside the worker, built from its `RequestTimings` once it finishes.

`zipkv.generate` (kind SERVER) is the Generate call, a child of the router's `zipkv.dispatch` span (its
context arrives as `traceparent` in the gRPC metadata), with the OpenTelemetry GenAI attributes. Its
children are recorded after the fact with the engine's own timestamps, so the engine thread never calls
OpenTelemetry and no span is opened per token:

    zipkv.queue      queued -> admitted (the whole life of a request aborted before admission)
    zipkv.admission  the admission decision: its worst case reserved (zipkv.admission.*)
    zipkv.prefill    the step that computed the prompt: zipkv.prefill.tokens, .prefix_hit_tokens
    zipkv.decode     first token -> finish: zipkv.decode.tokens, zipkv.decode.steps

An engine that cannot see inside its scheduler (SGLang) reports no admission time; its prefill span then
starts when the request was queued and says so (`zipkv.prefill.includes_queue_wait`), and the split is
in SGLang's own scheduler spans, which join the same trace (docs/observability.md).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from zipkv.protos import zipkv_pb2 as pb
from zipkv.worker.engine import EngineEvent
from zipkv.worker.engine_stats import RequestTimings

OPERATION = "text_completion"  # gen_ai.operation.name: the worker completes a prompt of token ids


def generate_attributes(
    request: pb.GenerateRequest, model: str, worker_id: str, engine: str
) -> dict[str, Any]:
    s = request.sampling
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.request.model": request.model or model,
        "gen_ai.request.max_tokens": s.max_new_tokens,
        "gen_ai.request.temperature": s.temperature,
        "gen_ai.request.top_p": s.top_p if s.top_p > 0 else 1.0,
        "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
        "zipkv.request.id": request.request_id,
        "zipkv.worker.id": worker_id,
        "zipkv.engine": engine,
    }
    if s.top_k:
        attrs["gen_ai.request.top_k"] = s.top_k
    if s.seed:
        attrs["gen_ai.request.seed"] = s.seed
    return attrs


def record_finish(span: trace.Span, tracer: trace.Tracer, event: EngineEvent) -> None:
    """The finish's usage on the Generate span, and its phase spans as children."""
    span.set_attribute("gen_ai.usage.input_tokens", event.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", event.completion_tokens)
    span.set_attribute("gen_ai.response.finish_reasons", [event.finish.value if event.finish else "error"])
    if event.ttft_ms:
        span.set_attribute("zipkv.ttft_ms", event.ttft_ms)
    if event.timings is not None:
        record_phases(tracer, span, event.timings)


def record_phases(tracer: trace.Tracer, parent: trace.Span, t: RequestTimings) -> None:
    ctx = trace.set_span_in_context(parent)

    def child(name: str, start_ns: int, end_ns: int, attrs: dict[str, Any]) -> None:
        if start_ns and end_ns >= start_ns:
            tracer.start_span(name, context=ctx, start_time=start_ns, attributes=attrs).end(end_time=end_ns)

    end_of_queue = t.admitted_ns or (t.finished_ns if not t.prefill_end_ns else 0)
    child("zipkv.queue", t.queued_ns, end_of_queue, {})
    child(
        "zipkv.admission",
        t.admitted_ns,
        t.admission_done_ns,
        {
            "zipkv.admission.reserved_tokens": t.reserved_tokens,
            "zipkv.admission.headroom_tokens": t.headroom_tokens,
        },
    )
    prefill: dict[str, Any] = {
        "zipkv.prefill.tokens": t.prefill_tokens,
        "zipkv.prefill.prefix_hit_tokens": t.prefix_hit_tokens,
    }
    if t.prefill_batch_requests:
        prefill["zipkv.prefill.batch_requests"] = t.prefill_batch_requests
    prefill_start = t.prefill_start_ns
    if not prefill_start and not t.admitted_ns:
        prefill_start = t.queued_ns
        prefill["zipkv.prefill.includes_queue_wait"] = True
    child("zipkv.prefill", prefill_start, t.prefill_end_ns, prefill)
    if t.prefill_end_ns:
        child(
            "zipkv.decode",
            t.prefill_end_ns,
            t.finished_ns,
            {"zipkv.decode.tokens": t.decode_tokens, "zipkv.decode.steps": t.decode_steps},
        )

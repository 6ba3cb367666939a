"""A worker lost while it serves: over real gRPC to scripted workers (stand-ins for GPU workers).

A non-streamed request whose worker fails mid-generation is opened again on another worker from scratch (its
client has seen nothing); a streamed one goes on from the tokens it sent, on another worker, in the same
stream (not for seeded sampling, whose promise of the same text a continuation cannot keep). A
worker whose connection was refused is tried last for `dispatch.unreachable_cooldown_s`, so that the
requests after the first do not each pay a connect attempt on it while its last report is still fresh.
"""

from __future__ import annotations

import json
import time

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from router_harness import MODEL, Stack, stack

from zipkv.controlplane.dispatch_request import UnreachableWorkers
from zipkv.testing.scripted_worker import Script

BODY = {"model": MODEL, "prompt": "x", "max_tokens": 4}


def reserved(s: Stack) -> int:
    store = s.router.router.store
    return sum(store.reserved_total(w.worker_id) for w in s.workers)  # type: ignore[attr-defined]


def metric(s: Stack, line_start: str) -> float:
    for line in httpx.get(s.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_non_streamed_request_is_answered_by_another_worker_when_its_worker_dies() -> None:
    with stack() as s:
        dying = s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)  # most headroom: first
        good = s.add_worker(total_tokens=100_000)
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "hell"  # the whole reply, from the second worker alone
        assert r.json()["usage"]["completion_tokens"] == 4
        assert r.headers["x-zipkv-worker"] == good.worker_id
        assert len(dying.seen.requests) == 1 and len(good.seen.requests) == 1
        assert dying.seen.requests[0].prompt_token_ids == good.seen.requests[0].prompt_token_ids
        assert metric(s, 'zipkv_router_retries_total{reason="lost_mid_request"}') == 1.0
        assert metric(s, "zipkv_router_stream_errors_total") == 1.0
        assert reserved(s) == 0 and s.router.router.inflight == 0


def sse_events(s: Stack, body: dict[str, object]) -> list[str]:
    with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def streamed_text(events: list[str]) -> str:
    chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {") and '"choices"' in e]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_a_stream_goes_on_from_its_tokens_on_another_worker() -> None:
    with stack() as s:
        dying = s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)  # most headroom: first
        good = s.add_worker(total_tokens=100_000)
        body = {**BODY, "max_tokens": 6, "stream_options": {"include_usage": True}}
        events = sse_events(s, body)
        assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
        # the dying worker's 2 tokens, then the good worker's 4 (the scripted reply from its start)
        assert streamed_text(events) == "he" + "hell"
        first, then = dying.seen.requests[0], good.seen.requests[0]
        assert list(then.prompt_token_ids) == [*first.prompt_token_ids, *b"he"]  # the prompt goes on
        assert then.sampling.max_new_tokens == 4  # 6 asked, 2 sent
        usage = json.loads(events[-2][6:])["usage"]
        assert usage["prompt_tokens"] == len(first.prompt_token_ids) and usage["completion_tokens"] == 6
        assert metric(s, 'zipkv_router_retries_total{reason="lost_mid_request"}') == 1.0
        assert reserved(s) == 0 and s.router.router.inflight == 0


def test_a_seeded_sampled_stream_or_resume_off_is_not_continued() -> None:
    with stack() as s:  # a seed promises the same text on a rerun: a continuation cannot keep that
        s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)
        good = s.add_worker(total_tokens=100_000)
        events = sse_events(s, {**BODY, "temperature": 0.8, "seed": 7})
        assert '"error"' in events[-1] and "failed mid-stream" in events[-1]
        assert good.seen.requests == []
        events = sse_events(s, {**BODY, "temperature": 0.0, "seed": 7})  # greedy: the seed changes nothing
        assert events[-1] == "data: [DONE]" and len(good.seen.requests) == 1
    with stack(dispatch={"resume_streams": False}) as s:
        s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)
        good = s.add_worker(total_tokens=100_000)
        events = sse_events(s, BODY)
        assert '"error"' in events[-1] and good.seen.requests == []
        assert metric(s, 'zipkv_router_retries_total{reason="lost_mid_request"}') == 0.0
        assert reserved(s) == 0


def test_no_second_worker_or_retries_off_gives_the_502() -> None:
    with stack() as s:  # the only worker failed it: nobody else to ask
        s.add_worker(Script(die_after_tokens=2))
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 502 and "failed mid-stream" in r.json()["error"]["message"]
        assert reserved(s) == 0 and s.router.router.inflight == 0
    with stack(dispatch={"mid_request_retries": 0}) as s:
        s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)
        good = s.add_worker(total_tokens=100_000)
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 502 and good.seen.requests == []


def test_every_worker_dying_is_tried_once_each_up_to_the_retries() -> None:
    with stack(dispatch={"mid_request_retries": 2}) as s:
        dying = [s.add_worker(Script(die_after_tokens=1), total_tokens=t) for t in (300_000, 200_000)]
        last = s.add_worker(Script(die_after_tokens=1), total_tokens=100_000)
        r = httpx.post(s.url + "/v1/completions", json=BODY)
        assert r.status_code == 502
        assert [len(w.seen.requests) for w in [*dying, last]] == [1, 1, 1]  # none asked twice
        assert metric(s, 'zipkv_router_retries_total{reason="lost_mid_request"}') == 2.0
        assert reserved(s) == 0


def count_unavailable_retries(cooldown_s: float) -> float:
    with stack(dispatch={"unreachable_cooldown_s": cooldown_s}) as s:
        dead = s.add_worker(total_tokens=200_000)
        # Started before the other stops: started after, it could be given the port just freed, and the
        # router's calls to the stopped worker would reach it.
        good = s.add_worker(total_tokens=100_000)
        s.loop.run(dead.stop(0))  # gone; its last report is still fresh, and it still ranks first
        for _ in range(3):
            r = httpx.post(s.url + "/v1/completions", json=BODY)
            assert r.status_code == 200 and r.headers["x-zipkv-worker"] == good.worker_id
        return metric(s, 'zipkv_router_retries_total{reason="unavailable"}')


def test_a_refused_worker_is_tried_last_for_the_cooldown() -> None:
    assert count_unavailable_retries(cooldown_s=60.0) == 1.0  # only the first request tried the dead one
    assert count_unavailable_retries(cooldown_s=0.0) == 3.0  # no cooldown: every request pays a try


def test_the_cooldown_ends_and_a_worker_that_answers_is_cleared() -> None:
    u = UnreachableWorkers(cooldown_s=5.0)
    u.mark("a", now_s=100.0)
    assert u.cooling("a", now_s=104.9) and not u.cooling("b", now_s=104.9)
    assert not u.cooling("a", now_s=105.0)
    u.mark("a", now_s=200.0)
    u.clear("a")
    assert not u.cooling("a", now_s=200.1)
    u.mark("b", now_s=300.0)
    u.mark("c", now_s=306.0)  # b's cooldown is over: its entry goes
    assert u.cooling("c", now_s=306.0) and not u.cooling("b", now_s=304.0)


def test_the_trace_tells_which_worker_was_lost_and_what_went_on() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with stack(app_kwargs={"tracer_provider": provider}) as s:
        dying = s.add_worker(Script(die_after_tokens=2), total_tokens=200_000)
        good = s.add_worker(total_tokens=100_000)
        assert sse_events(s, {**BODY, "max_tokens": 6})[-1] == "data: [DONE]"
        deadline = time.monotonic() + 5
        while not any(sp.name == f"text_completion {MODEL}" for sp in exporter.get_finished_spans()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    root = next(sp for sp in exporter.get_finished_spans() if sp.name == f"text_completion {MODEL}")
    (event,) = [e for e in root.events if e.name == "zipkv.worker_lost"]
    assert dict(event.attributes or {}) == {
        "zipkv.worker.lost": dying.worker_id,
        "zipkv.worker.next": good.worker_id,
        "zipkv.resumed": True,
        "zipkv.tokens_sent": 2,
    }
    assert (root.attributes or {})["zipkv.worker.id"] == good.worker_id
    assert (root.attributes or {})["gen_ai.usage.output_tokens"] == 6
    dispatches = [sp for sp in exporter.get_finished_spans() if sp.name == "zipkv.dispatch"]
    assert len(dispatches) == 2 and all(
        d.parent and d.parent.span_id == root.context.span_id for d in dispatches
    )

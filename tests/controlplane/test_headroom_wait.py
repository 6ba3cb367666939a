"""placement.headroom_wait_ms: a request every worker lacks only headroom for waits at the router and is
placed once a report shows room; anything else, or a wait past the bound, is answered at once (503)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from router_harness import MODEL, stack

from zipkv.controlplane.placement.headroom_wait import wait_for_headroom

NEEDS_202 = {"model": MODEL, "prompt": "x", "max_tokens": 200}  # 2 prompt tokens (byte tokenizer) + 200


@pytest.mark.parametrize(
    ("filtered", "waited_ms", "limit_ms", "wait"),
    [
        ({"headroom": 1}, 0.0, 5000, True),  # busy worker: wait for it
        ({"headroom": 3}, 4999.0, 5000, True),
        ({"headroom": 1}, 5000.0, 5000, False),  # waited long enough
        ({"headroom": 1}, 0.0, 0, False),  # waiting turned off
        ({}, 0.0, 5000, False),  # no worker serves the model: waiting will not bring one
        ({"draining": 1}, 0.0, 5000, False),
        ({"too_large": 2}, 0.0, 5000, False),  # never fits, even idle
        ({"slo_wait": 1}, 0.0, 5000, False),  # placement chose to shed it
        ({"headroom": 1, "slo_wait": 1}, 0.0, 5000, False),  # one worker is a deliberate shed
        # another worker drains, is too small or stopped reporting: the busy one may still free room
        ({"headroom": 1, "expired": 1}, 0.0, 5000, True),
        ({"headroom": 1, "draining": 2}, 0.0, 5000, True),
        ({"headroom": 1, "too_large": 1, "context": 1}, 0.0, 5000, True),
        ({"expired": 1, "draining": 1}, 0.0, 5000, False),  # nobody lacks only headroom
    ],
)
def test_wait_only_while_headroom_alone_keeps_every_worker_out(
    filtered: dict[str, int], waited_ms: float, limit_ms: float, wait: bool
) -> None:
    assert wait_for_headroom(filtered, waited_ms, limit_ms) is wait


def test_a_request_waits_for_headroom_and_is_placed_when_a_report_shows_it() -> None:
    with stack(placement={"headroom_wait_ms": 10_000}) as st:
        w = st.add_worker(total_tokens=1000)
        assert st.report(w, headroom_tokens=100).accepted  # busy: 100 of its 1000 tokens free
        freed = threading.Timer(0.6, lambda: st.report(w, headroom_tokens=900))
        freed.start()
        t0 = time.monotonic()
        r = httpx.post(st.url + "/v1/completions", json=NEEDS_202, timeout=30)
        waited_s = time.monotonic() - t0
        freed.join()
        assert r.status_code == 200, r.text
        assert 0.5 < waited_s < 5.0, waited_s  # placed after the report, not at the bound
        metrics = httpx.get(st.url + "/metrics").text
        assert 'zipkv_router_headroom_wait_ms_count{outcome="placed"} 1.0' in metrics


def test_a_wait_past_the_bound_is_a_503_and_is_counted() -> None:
    with stack(placement={"headroom_wait_ms": 400}) as st:
        w = st.add_worker(total_tokens=1000)
        assert st.report(w, headroom_tokens=100).accepted
        t0 = time.monotonic()
        r = httpx.post(st.url + "/v1/completions", json=NEEDS_202, timeout=30)
        waited_s = time.monotonic() - t0
        assert r.status_code == 503 and "1 worker without KV headroom for it" in r.json()["error"]["message"]
        assert 0.35 < waited_s < 3.0, waited_s
        metrics = httpx.get(st.url + "/metrics").text
        assert 'zipkv_router_headroom_wait_ms_count{outcome="refused"} 1.0' in metrics


def test_no_wait_when_no_worker_serves_the_model() -> None:
    with stack(placement={"headroom_wait_ms": 10_000}) as st:
        t0 = time.monotonic()
        r = httpx.post(st.url + "/v1/completions", json=NEEDS_202, timeout=30)
        assert r.status_code == 503 and time.monotonic() - t0 < 2.0

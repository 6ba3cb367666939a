"""Capacity reports are untrusted input: every field is range-checked at the boundary, a bad report is
refused and counted, and nothing a report holds can make placement raise or place on a refused worker.
Over real gRPC to a real router (scripted workers stand in for GPU workers)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from router_harness import MODEL, Stack, stack

from zipkv.controlplane.placement import RequestShape, place
from zipkv.protos import zipkv_pb2 as pb


@pytest.fixture(scope="module")
def s() -> Iterator[Stack]:
    with stack() as st_:
        yield st_


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"queued_requests": -1}, "queued_requests"),  # made placement divide by zero (500s)
        ({"running_requests": -3}, "running_requests"),
        ({"headroom_tokens": -1}, "headroom_tokens"),
        ({"total_tokens": -5, "headroom_tokens": 0}, "total_tokens"),
        ({"headroom_tokens": 200_000}, "headroom_tokens"),  # more free than the whole budget (100k)
        ({"queued_prefill_tokens": -7}, "queued_prefill_tokens"),
        ({"kv_bytes_per_token": -1}, "kv_bytes_per_token"),
        ({"max_context_tokens": -1}, "max_context_tokens"),
        ({"itl_ms": -1.0}, "itl_ms"),
        ({"ttft_ms": math.nan}, "ttft_ms"),
        ({"itl_ms": math.inf}, "itl_ms"),
        ({"compression_ratio": 1.5}, "compression_ratio"),
        ({"compression_ratio": math.nan}, "compression_ratio"),
        ({"timestamp_s": math.nan}, "timestamp_s"),
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": "a b\n"}, "worker_id"),
        ({"address": "nohost"}, "address"),
        ({"address": "h:0"}, "address"),
        ({"address": "h:99999"}, "address"),
        ({"model": "not-served"}, "model"),
        ({"sequence": 0}, "sequence"),
    ],
)
def test_out_of_range_fields_are_refused_and_counted(s: Stack, overrides: dict[str, Any], field: str) -> None:
    w = s.add_worker(report=False)
    ack = s.report(w, **overrides)
    assert not ack.accepted and field in ack.reason
    assert all(v.worker_id != w.worker_id for v in s.router.router.store.snapshot().workers)
    text = httpx.get(s.url + "/metrics").text
    assert f'zipkv_router_report_rejections_total{{field="{field}"}}' in text


def test_a_report_from_the_future_is_refused(s: Stack) -> None:
    # A future timestamp used to be never late: the view would never be treated as stale.
    w = s.add_worker(report=False)
    ack = s.report(w, timestamp_s=time.time() + 3600)
    assert not ack.accepted and ack.reason.startswith("from the future")
    assert 'zipkv_router_reports_total{outcome="future"}' in httpx.get(s.url + "/metrics").text


def test_a_negative_queue_report_no_longer_breaks_completions() -> None:
    with stack() as st_:
        w = st_.add_worker()
        assert not st_.report(w, queued_requests=-1).accepted
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        r = httpx.post(st_.url + "/v1/completions", json=body)
        assert r.status_code == 200, r.text


_ids = itertools.count()
_i64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_i32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
_u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
_small = st.integers(min_value=-10, max_value=200_000)
_f = st.floats(allow_nan=True, allow_infinity=True)
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)  # protobuf strings are UTF-8
_fields = st.fixed_dictionaries(
    {
        "worker_id": st.one_of(st.none(), _text),
        "address": st.one_of(st.none(), _text),
        "model": st.sampled_from([MODEL, MODEL, "other", ""]),
        "sequence": st.one_of(st.integers(1, 5), _u64),
        "epoch": _u64,
        "timestamp_offset_s": st.one_of(st.floats(-3, 3), _f),
        "headroom_tokens": st.one_of(_small, _i64),
        "committed_tokens": st.one_of(_small, _i64),
        "total_tokens": st.one_of(_small, _i64),
        "compression_ratio": st.one_of(st.floats(0, 1), _f),
        "running_requests": st.one_of(_small, _i32),
        "queued_requests": st.one_of(st.integers(-2, 5), _i32),
        "queued_prefill_tokens": st.one_of(_small, _i64),
        "ttft_ms": st.one_of(st.floats(0, 100), _f),
        "itl_ms": st.one_of(st.floats(0, 100), _f),
        "draining": st.booleans(),
        "max_context_tokens": st.one_of(_small, _i32),
        "kv_bytes_per_token": st.one_of(st.integers(-5, 1 << 20), _i64),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=_fields, prompt=st.integers(1, 2000), max_new=st.integers(1, 2000))
def test_placement_never_raises_and_never_uses_a_refused_report(
    s: Stack, fields: dict[str, Any], prompt: int, max_new: int
) -> None:
    fields = dict(fields)
    n = next(_ids)
    fields["worker_id"] = fields["worker_id"] if fields["worker_id"] is not None else f"prop-{n}"
    fields["address"] = fields["address"] if fields["address"] is not None else f"127.0.0.1:{1 + n % 60000}"
    offset = fields.pop("timestamp_offset_s")
    report = pb.CapacityReport(timestamp_s=time.time() + offset, **fields)
    ack = s.send(report)
    accepted = s.__dict__.setdefault("prop_accepted", set())
    if ack.accepted:
        accepted.add(report.worker_id)
    snap = s.router.router.store.snapshot()
    shape = RequestShape(MODEL, prompt, max_new, 2000.0, 100.0, 0.05)
    decision = place(snap, shape, s.cfg.placement, time.time())  # must not raise, whatever was reported
    placed = {c.worker.worker_id for c in decision.ranked}
    assert placed <= accepted
    for c in decision.ranked:
        assert math.isfinite(c.score) and 0.0 <= c.score <= 1.0

"""placement.shed_wait_over_ttft: a worker whose queued prefill alone would eat more than that fraction of
the request's TTFT target is no candidate (`slo_wait`); with none left the router answers 503.

Every row: prefill_ms_per_token 0.5, TTFT target 1000 ms, so the wait is
(max(queued - listed_done, 0) + unseen_prefill) x 0.5 ms (state.py, prefill accounting).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement import RequestShape, place, prefill_wait_ms
from zipkv.controlplane.state import Snapshot, WorkerView
from zipkv.protos.capacity import Capacity

NOW = 10_000.0


def view(
    wid: str,
    queued_prefill: int = 0,
    unseen_prefill: int = 0,
    free: int = 50_000,
    listed_done: int = 0,
    reserved: int = 0,
) -> WorkerView:
    cap = Capacity(
        headroom_tokens=free,
        committed_tokens=0,
        total_tokens=100_000,
        compression_ratio=1.0,
        running_requests=0,
        queued_requests=1 if queued_prefill else 0,
        queued_prefill_tokens=queued_prefill,
        ttft_ms=0.0,
        itl_ms=0.0,
        max_context_tokens=0,
        kv_bytes_per_token=0,
    )
    return WorkerView(
        wid,
        f"{wid}:1",
        "m",
        1,
        1,
        NOW - 0.1,
        NOW - 0.1,
        False,
        cap,
        reserved_tokens=reserved,
        unseen_prefill_tokens=unseen_prefill,
        listed_done_tokens=listed_done,
    )


REQ = RequestShape("m", 400, 100, slo_ttft_ms=1000.0, slo_tpot_ms=100.0, prefill_ms_per_token=0.5)


@pytest.mark.parametrize(
    ("queued", "unseen", "listed_done", "reserved", "wait_ms"),
    [
        (0, 0, 0, 0, 0.0),
        (1000, 0, 0, 0, 500.0),  # 1000 x 0.5
        (600, 400, 0, 0, 500.0),  # prompts placed that the report cannot list yet are queued prefill too
        (0, 2000, 0, 0, 1000.0),
        (1000, 0, 800, 0, 100.0),  # 800 of the reported queue are prefix hits or done: 200 x 0.5
        (1000, 0, 1500, 0, 0.0),  # never below an empty queue
        (1000, 200, 1500, 0, 100.0),  # the unseen prompts still count
        (1000, 0, 0, 9000, 500.0),  # the headroom reservations (prompts and outputs) are not prefill
    ],
)
def test_prefill_wait_counts_the_queue_net_of_cache_hits_and_unseen_prompts(
    queued: int, unseen: int, listed_done: int, reserved: int, wait_ms: float
) -> None:
    v = view("a", queued, unseen, listed_done=listed_done, reserved=reserved)
    assert prefill_wait_ms(v, REQ) == pytest.approx(wait_ms)


@pytest.mark.parametrize(
    ("factor", "queued", "kept"),
    [
        (0.0, 100_000, True),  # off (the default): any queue is a candidate
        (0.25, 499, True),  # 249.5 ms <= 0.25 x 1000 ms
        (0.25, 500, True),  # 250 ms: at the bound, still a candidate
        (0.25, 501, False),  # 250.5 ms > 250 ms
        (0.5, 1000, True),  # 500 ms <= 500 ms
        (0.5, 1002, False),  # 501 ms > 500 ms
    ],
)
def test_a_worker_past_the_wait_bound_is_dropped_as_slo_wait(factor: float, queued: int, kept: bool) -> None:
    cfg = PlacementConfig(shed_wait_over_ttft=factor)
    d = place(Snapshot((view("a", queued),), NOW), REQ, cfg, NOW)
    assert [c.worker.worker_id for c in d.ranked] == (["a"] if kept else [])
    assert d.filtered == ({} if kept else {"slo_wait": 1})


def test_the_bound_scales_with_each_requests_ttft_target() -> None:
    cfg = PlacementConfig(shed_wait_over_ttft=0.25)
    workers = Snapshot((view("busy", queued_prefill=2000), view("idle")), NOW)  # busy: 1000 ms of prefill
    strict = place(workers, REQ, cfg, NOW)
    relaxed = place(workers, replace(REQ, slo_ttft_ms=5000.0), cfg, NOW)  # bound 1250 ms
    assert [c.worker.worker_id for c in strict.ranked] == ["idle"]
    assert strict.filtered == {"slo_wait": 1}
    assert {c.worker.worker_id for c in relaxed.ranked} == {"busy", "idle"}


def test_headroom_is_checked_before_the_wait() -> None:
    cfg = PlacementConfig(shed_wait_over_ttft=0.25)
    full_and_busy = view("a", queued_prefill=10_000, free=100)  # needs 500 tokens, has 100
    assert place(Snapshot((full_and_busy,), NOW), REQ, cfg, NOW).filtered == {"headroom": 1}

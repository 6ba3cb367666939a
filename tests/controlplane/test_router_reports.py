"""Capacity reports over real gRPC: authentication, validation, order, lateness, expiry; and the
reservation accounting of the in-memory store."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import httpx
import pytest
from router_harness import TOKEN, stack

from zipkv.controlplane.state import MemoryStore, WorkerView, view_from_json, view_to_json
from zipkv.protos.capacity import Capacity
from zipkv.testing.scripted_worker import ScriptedWorker


def test_reports_need_the_shared_token() -> None:
    with stack() as s:
        w = s.add_worker(report=False)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            s.report(w, token="wrong")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError):
            s.report(w, token="")
        assert s.router.router.store.snapshot().workers == ()
        assert s.report(w, token=TOKEN).accepted


def test_out_of_order_and_late_reports_are_ignored() -> None:
    with stack() as s:
        w = s.add_worker(report=False)
        assert s.report(w, sequence=10, headroom_tokens=5000).accepted
        old = s.report(w, sequence=9, headroom_tokens=99_000)  # arrives after 10: ignored
        assert not old.accepted and "out of order" in old.reason
        dup = s.report(w, sequence=10, headroom_tokens=99_000)
        assert not dup.accepted
        late = s.report(
            w, sequence=11, headroom_tokens=99_000, timestamp_s=time.time() - 3.0
        )  # built 3 s ago
        assert not late.accepted and late.reason.startswith("late")
        (view,) = s.router.router.store.snapshot().workers
        assert (view.sequence, view.capacity.headroom_tokens) == (10, 5000)
        # A restarted worker bumps its epoch: sequence may start over.
        assert s.report(w, sequence=1, epoch=w.epoch + 1, headroom_tokens=7000).accepted
        (view,) = s.router.router.store.snapshot().workers
        assert (view.sequence, view.capacity.headroom_tokens) == (1, 7000)
        text = httpx.get(s.url + "/metrics").text
        assert 'zipkv_router_reports_total{outcome="out_of_order"} 2.0' in text
        assert 'zipkv_router_reports_total{outcome="late"} 1.0' in text


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"worker_id": ""}, "worker_id"),
        ({"headroom_tokens": -1}, "headroom_tokens"),
        ({"compression_ratio": 1.5}, "compression_ratio"),
    ],
)
def test_malformed_reports_are_refused(overrides: dict[str, Any], needle: str) -> None:
    with stack() as s:
        w = s.add_worker(report=False)
        ack = s.report(w, **overrides)
        assert not ack.accepted and needle in ack.reason


def test_workers_whose_reports_stop_expire() -> None:
    with stack(placement={"stale_after_ms": 100, "expire_after_ms": 300}) as s:
        s.add_worker()
        body = {"model": "zipkv-tiny", "prompt": "x", "max_tokens": 2}
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        time.sleep(0.4)
        r = httpx.post(s.url + "/v1/completions", json=body)
        assert r.status_code == 503 and "retry-after" in r.headers
        assert s.router.router.store.snapshot().workers == ()
        assert 'zipkv_router_workers{model="zipkv-tiny"} 0.0' in httpx.get(s.url + "/metrics").text


def _view(free: int, received_s: float, seq: int = 1) -> WorkerView:
    cap = Capacity(free, 0, 10_000, 1.0, 0, 0, 0, 0.0, 0.0, 0, 0)
    return WorkerView("w", "a:1", "m", 1, seq, received_s, received_s, False, cap)


def test_reservation_accounting_never_over_commits() -> None:
    async def scenario() -> None:
        now = [100.0]
        store = MemoryStore(5000, 900.0, clock=lambda: now[0])
        assert await store.put_report(_view(1000, 100.0)) is None
        assert await store.reserve("w", "r1", 600, 100.0)
        assert not await store.reserve("w", "r2", 600, 100.0)  # 1000 - 600 = 400 < 600
        assert store.snapshot().workers[0].headroom_tokens == 400
        await store.mark_started("w", "r1", 100.5)  # first token arrived at 100.5
        # A report received at 100.6 may have been built before the worker admitted r1 (it can take up
        # to report_delay_bound 200 ms to arrive): r1 still counts, 400 - 600 = -200 (conservative).
        now[0] = 100.6
        assert await store.put_report(_view(400, 100.6, seq=2)) is None
        assert store.snapshot().workers[0].headroom_tokens == -200
        # Received at 100.8 >= 100.5 + 0.2: built after the admission, so it already counts r1.
        now[0] = 100.8
        assert await store.put_report(_view(400, 100.8, seq=3)) is None
        assert store.snapshot().workers[0].headroom_tokens == 400
        assert not await store.reserve("w", "r2", 600, 100.8)
        assert await store.reserve("w", "r2", 400, 100.8)
        await store.release("w", "r1")
        await store.release("w", "r2")
        assert store.reserved_total("w") == 0

    asyncio.run(scenario())


def test_a_crashed_routers_reservations_expire() -> None:
    async def scenario() -> None:
        store = MemoryStore(5000, reservation_ttl_s=10.0, clock=lambda: 100.0)
        await store.put_report(_view(1000, 100.0))
        assert await store.reserve("w", "lost", 1000, 100.0)
        assert not await store.reserve("w", "r", 1, 105.0)
        assert await store.reserve("w", "r", 1000, 110.5)  # "lost" expired at 110

    asyncio.run(scenario())


def test_scripted_worker_health_over_grpc() -> None:
    from zipkv.protos import zipkv_pb2 as pb
    from zipkv.protos import zipkv_pb2_grpc as pb_grpc

    async def scenario() -> None:
        w = ScriptedWorker()
        addr = await w.start()
        async with grpc.aio.insecure_channel(addr) as ch:
            h = await pb_grpc.WorkerStub(ch).Health(pb.HealthRequest(), timeout=5)
        await w.stop(0)
        assert h.serving and h.worker_id == w.worker_id

    asyncio.run(scenario())


WORKER_A_TOKEN = "token-of-worker-a-0123456789"


def test_a_per_worker_token_reports_only_its_own_worker_ids() -> None:
    # The shared token lets any holder speak for any worker_id; a per-worker token is bound to one
    # identity: it may report `a` and `a/<replica>`, never another worker's id.
    with stack(security={"worker_tokens": {"a": WORKER_A_TOKEN}}) as s:
        mine = s.add_worker(report=False, worker_id="a/replica-1")
        other = s.add_worker(report=False, worker_id="b/replica-1")
        assert s.report(mine, token=WORKER_A_TOKEN).accepted
        with pytest.raises(grpc.aio.AioRpcError) as err:
            s.report(other, token=WORKER_A_TOKEN)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError):
            s.report(s.add_worker(report=False, worker_id="ab"), token=WORKER_A_TOKEN)  # not under "a/"
        assert [v.worker_id for v in s.router.router.store.snapshot().workers] == ["a/replica-1"]
        assert 'zipkv_router_reports_total{outcome="forbidden"} 2.0' in httpx.get(s.url + "/metrics").text


def test_a_replayed_report_is_refused() -> None:
    with stack() as s:
        w = s.add_worker(report=False)
        report = w.report(headroom_tokens=100)
        assert s.send(report).accepted
        again = s.send(report)  # captured and sent again, e.g. to pin stale headroom
        assert not again.accepted and "out of order" in again.reason


def test_the_shared_state_json_round_trips_and_reads_the_old_key() -> None:
    view = _view(1234, 100.0)
    assert view_from_json(view_to_json(view)) == view
    old = json.loads(view_to_json(view))
    old["free_tokens"] = old.pop("headroom_tokens")  # as a router from before the rename wrote it
    assert view_from_json(json.dumps(old)).capacity.headroom_tokens == 1234

"""Claims (placement/headroom_wait.py, controlplane/headroom_claim.py): a waiting request claims the worker
short of the fewest tokens, so requests arriving behind it cannot keep taking the room it waits for; the
claim becomes its reservation once the room is there, and is given back when it leaves the wait otherwise.
Table tests of the pure picks, the stores' claim rule (in memory and in a real redis-server), and the
router end to end over HTTP with a scripted worker (a stand-in for a GPU worker)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from router_harness import MODEL, make_config, stack
from test_router_placement import NOW, req, snap, view

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement.headroom_wait import claim_state, claim_target
from zipkv.controlplane.redis_store import RedisStore
from zipkv.controlplane.state import MemoryStore, Store, WorkerView
from zipkv.protos.capacity import Capacity

CFG = PlacementConfig()


# need = 100 + 100 = 200 tokens in every row
@pytest.mark.parametrize(
    ("views", "want"),
    [
        ((view("a", 150), view("b", 50)), "a"),  # short of 50 against 150
        ((view("a", 50), view("b", 150)), "b"),
        ((view("b", 150), view("a", 150)), "a"),  # a tie: worker_id
        ((view("a", 150, draining=True), view("b", 50)), "b"),  # draining: waiting will not help
        ((view("a", 150, total=150), view("b", 10)), "b"),  # too large for a: never fits there
        ((view("a", 190, age_s=6.0), view("b", 10)), "b"),  # expired
        ((view("a", 150, reserved_tokens=100), view("b", 60)), "b"),  # another's reservation counts
        ((view("a", 150, claimed_tokens=300, reserved_tokens=300), view("b", 10)), "b"),  # a is claimed
        ((view("a", 150, claimed_tokens=300, reserved_tokens=300),), None),  # one claim a worker
        ((view("a", 150, draining=True),), None),  # nobody to claim
        ((), None),
    ],
)
def test_the_claim_goes_to_the_worker_short_of_the_fewest_tokens(
    views: tuple[WorkerView, ...], want: str | None
) -> None:
    got = claim_target(snap(*views), req(), CFG, NOW)
    assert (got.worker_id if got else None) == want


@pytest.mark.parametrize(
    ("views", "state"),
    [
        ((view("a", 150, reserved_tokens=200),), "waits"),  # 150 - 200 (its own claim) < 0
        ((view("a", 200, reserved_tokens=200),), "fits"),  # room for the claim: convert it
        ((view("a", 150, reserved_tokens=200, draining=True),), "lost"),
        ((view("a", 150, reserved_tokens=200, age_s=6.0),), "lost"),  # its reports stopped
        ((view("b", 10_000),), "lost"),  # gone from the snapshot
    ],
)
def test_a_claim_fits_waits_or_is_lost(views: tuple[WorkerView, ...], state: str) -> None:
    assert claim_state(snap(*views), "a", req(), CFG, NOW) == state


def _view(headroom: int, received_s: float, seq: int) -> WorkerView:
    cap = Capacity(headroom, 0, 1000, 0.7, 0, 0, 0, 5.0, 2.0, 4096, 4096)
    return WorkerView("w", "w:1", MODEL, 1, seq, received_s, received_s, False, cap)


async def _claim_rules(store: Store, put: Callable[[WorkerView], Any], now_s: float) -> None:
    """The claim rule any store keeps: taken though it does not fit, counted against the others, turned
    into the reservation under its own id once the headroom less the others holds it."""
    await put(_view(100, now_s, 1))
    assert await store.reserve("w", "long", 800, now_s, prefill_tokens=798, claim=True)  # 100 < 800: claimed
    assert not await store.reserve("w", "short", 50, now_s)  # 100 - 800 < 50: the claim holds the room
    assert not await store.reserve("w", "long", 800, now_s)  # converting needs 800 free besides the others
    await put(_view(850, now_s + 0.5, 2))  # running requests finished
    assert not await store.reserve("w", "short", 100, now_s + 0.5)  # 850 - 800 < 100: it still waits
    assert await store.reserve("w", "short", 50, now_s + 0.5)  # what is left past the claim is free
    assert await store.reserve("w", "long", 800, now_s + 0.5)  # 850 - 50 >= 800: the claim converts
    await store.release("w", "long")
    await store.release("w", "short")
    assert await store.reserve("w", "after", 850, now_s + 0.6)  # both gave back everything


def test_the_memory_store_keeps_the_claim_rule() -> None:
    store = MemoryStore(5000, 900.0, clock=lambda: 100.0)

    async def put(v: WorkerView) -> None:
        assert await store.put_report(v) is None

    asyncio.run(_claim_rules(store, put, 100.0))


def test_no_report_is_taken_to_list_a_claim() -> None:
    # A reservation is taken as listed in a report built after the worker got the request; a claim's
    # request is still at the router, so its prompt stays in the predicted prefill queue until placed.
    now = [100.0]
    store = MemoryStore(5000, 900.0, clock=lambda: now[0])

    async def scenario() -> tuple[int, int]:
        await store.put_report(_view(100, 100.0, 1))
        assert await store.reserve("w", "long", 800, 100.0, prefill_tokens=798, claim=True)
        now[0] = 101.0
        await store.put_report(_view(100, 101.0, 2))  # 1 s later: past the report delay bound
        claimed = store.snapshot().workers[0].unseen_prefill_tokens
        assert not await store.reserve("w", "other", 10, 101.0)
        await store.put_report(_view(900, 101.0, 3))
        assert await store.reserve("w", "long", 800, 101.0, prefill_tokens=798)  # placed now
        now[0] = 102.0
        await store.put_report(_view(100, 102.0, 4))
        return claimed, store.snapshot().workers[0].unseen_prefill_tokens

    claimed, placed = asyncio.run(scenario())
    assert claimed == 798  # never listed while claimed
    assert placed == 0  # placed at 101.0; the report at 102.0 lists it (cached 0: nothing comes off)


def test_redis_keeps_the_claim_rule(redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = redis_server
    cfg = make_config(state={"backend": "redis", "redis_url": url})

    async def scenario() -> None:
        store = RedisStore(cfg, clock=time.time)

        async def put(v: WorkerView) -> None:
            assert await store.put_report(v) is None

        try:
            await _claim_rules(store, put, time.time())
        finally:
            await store.close()

    asyncio.run(scenario())


def _post(url: str, max_tokens: int, out: dict[str, Any], key: str) -> threading.Thread:
    """POST a completion in a thread; `out[key]` gets (status, seconds from the start) when it answers."""

    def run() -> None:
        t0 = time.monotonic()
        body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        out[key] = (r.status_code, time.monotonic() - t0)

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("claims", [True, False])
def test_a_short_request_does_not_take_the_room_a_long_one_waits_for(claims: bool) -> None:
    # One worker of 1,000 tokens with 100 free. A long request (2 prompt tokens + 800) waits; a short
    # one (2 + 100) arrives once 500 are free. Without claims it takes them at once, and the long one
    # waits on; with a claim the short one waits behind it until the worker has room for both.
    with stack(placement={"headroom_wait_ms": 10_000, "claim_headroom": claims}) as st:
        w = st.add_worker(total_tokens=1000)
        assert st.report(w, headroom_tokens=100).accepted
        out: dict[str, Any] = {}
        long = _post(st.url, 800, out, "long")
        time.sleep(0.4)  # the long request has waited a few rounds (and claimed the worker)
        assert st.report(w, headroom_tokens=500).accepted
        short = _post(st.url, 100, out, "short")
        time.sleep(1.0)
        short_placed_early = "short" in out
        assert st.report(w, headroom_tokens=1000).accepted
        long.join()
        short.join()
        assert out["long"][0] == 200 and out["short"][0] == 200, out
        metrics = httpx.get(st.url + "/metrics").text
    assert short_placed_early is not claims
    if claims:
        assert 'zipkv_router_claims_total{outcome="placed"} 1.0' in metrics  # the short one only waited
        assert 'zipkv_router_placements_total{mode="claim",worker="' in metrics


def test_a_claim_is_given_back_when_the_wait_runs_out() -> None:
    with stack(placement={"headroom_wait_ms": 400, "claim_headroom": True}) as st:
        w = st.add_worker(total_tokens=1000)
        assert st.report(w, headroom_tokens=100).accepted
        r = httpx.post(st.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 800})
        assert r.status_code == 503 and "1 worker without KV headroom for it" in r.json()["error"]["message"]
        metrics = httpx.get(st.url + "/metrics").text
        assert 'zipkv_router_claims_total{outcome="refused"} 1.0' in metrics
        store = st.router.router.store
        assert isinstance(store, MemoryStore) and store.reserved_total(w.worker_id) == 0
        # the room the claim held is free again: a request that fits it is placed at once
        r = httpx.post(st.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 90})
        assert r.status_code == 200, r.text


def test_a_claim_on_a_worker_that_starts_draining_moves_to_another() -> None:
    with stack(placement={"headroom_wait_ms": 10_000, "claim_headroom": True}) as st:
        a = st.add_worker(total_tokens=1000)
        b = st.add_worker(total_tokens=1000)
        assert st.report(a, headroom_tokens=600).accepted  # short of 202: a is claimed
        assert st.report(b, headroom_tokens=100).accepted
        out: dict[str, Any] = {}
        long = _post(st.url, 800, out, "long")
        time.sleep(0.4)
        assert st.report(a, headroom_tokens=1000, draining=True).accepted  # room, but leaving
        time.sleep(0.4)
        assert "long" not in out  # not placed on the draining worker
        assert st.report(b, headroom_tokens=1000).accepted
        long.join()
        assert out["long"][0] == 200, out
        metrics = httpx.get(st.url + "/metrics").text
        assert 'zipkv_router_claims_total{outcome="lost"} 1.0' in metrics
        assert b.peak_committed_tokens >= 802 and a.peak_committed_tokens == 0


def test_a_claim_redis_holds_is_released_there_after_an_outage(
    redis_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    # The claim is taken in Redis; then Redis stops answering this router (its calls refused), which
    # degrades it: the claim turns into a local reservation and is released locally. Redis still holds
    # the claim, so its release is replayed there once Redis answers again; a request that never claimed
    # leaves nothing to replay.
    url, _ = redis_server
    cfg = make_config(state={"backend": "redis", "redis_url": url})

    async def scenario() -> tuple[dict[str, str], dict[str, str], int]:
        store = RedisStore(cfg, clock=time.time)
        try:
            now = time.time()
            assert await store.put_report(_view(100, now, 1)) is None
            assert await store.reserve("w", "long", 800, now, prefill_tokens=798, claim=True)
            held = dict(await store._redis.hgetall(store._r("w")))
            real_reserve = store._reserve

            async def refused(**_: Any) -> Any:
                raise ConnectionRefusedError("redis down")

            store._reserve = refused  # type: ignore[method-assign]
            assert await store.put_report(_view(900, now + 0.5, 2)) is None
            assert await store.reserve("w", "long", 800, now + 0.5)  # degraded: taken locally
            assert store.degraded
            assert await store.reserve("w", "short", 50, now + 0.5)
            await store.release("w", "long")
            await store.release("w", "short")
            pending = len(store._pending_release)
            store._reserve = real_reserve  # type: ignore[method-assign]
            await store._flush_releases()  # what the refresh loop runs once Redis answers
            return held, dict(await store._redis.hgetall(store._r("w"))), pending
        finally:
            await store.close()

    held, after, pending = asyncio.run(scenario())
    assert list(held) == ["long"] and held["long"].endswith(":-1")  # stored as a claim
    assert pending == 1  # the claim's release only, not the request that never claimed
    assert after == {}

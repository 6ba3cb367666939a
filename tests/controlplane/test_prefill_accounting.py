"""Prefill accounting (state.py): the prefill queued ahead on a worker, net of prefix-cache hits, as the
`slo_wait` filter and the TTFT prediction both read it (placement/predict.py).

A report received at REPORT_S = 100.0, report_delay_bound 0.2 s: a reservation placed at or before 99.8 is
listed by it (the report was built after the worker got the request) until its first token.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from servers import free_port, start_redis
from test_router_placement import view

from zipkv.controlplane.config import ModelConfig, PlacementConfig, RouterConfig, StateConfig
from zipkv.controlplane.placement import RequestShape, place, prefill_wait_ms, queued_prefill_tokens
from zipkv.controlplane.placement.predict import shed_wait_ms
from zipkv.controlplane.prefix_index import PrefixMatch
from zipkv.controlplane.redis_scripts import parse_reservations
from zipkv.controlplane.redis_store import RedisStore
from zipkv.controlplane.reservations import Reservation, prefill_accounting
from zipkv.controlplane.state import (
    MemoryStore,
    Snapshot,
    WorkerView,
    bare,
    view_from_json,
    view_to_json,
    with_reservations,
)
from zipkv.protos.capacity import Capacity

REPORT_S = 100.0
DELAY_S = 0.2
NOW_S = 100.1
TTL = 1000.0  # expires_s of a live reservation


def res(
    tokens: int = 1100,
    started_s: float = 0.0,
    prefill: int | None = 800,
    cached: int = 200,
    placed_s: float = 99.0,
    expires_s: float = TTL,
) -> Reservation:
    """A reservation of a 1000-token prompt (800 to prefill, 200 cached) and 100 new tokens by default."""
    return Reservation(tokens, started_s, expires_s, prefill, cached, placed_s)


@pytest.mark.parametrize(
    ("r", "unseen", "listed_done"),
    [
        (res(), 0, 200),  # listed, not started: its 200 cached tokens come off the reported queue
        (res(placed_s=99.8), 0, 200),  # placed exactly one delay bound before the report: listed
        (res(placed_s=99.9), 800, 0),  # placed after 99.8: the report may not list it; its prefill adds
        (res(placed_s=100.05), 800, 0),  # placed after the report
        (res(started_s=100.05), 0, 1000),  # listed, first token since the report: its whole prompt is done
        (res(started_s=99.95), 0, 0),  # first token before the report: not in it, and done
        (res(placed_s=99.9, started_s=100.05), 0, 0),  # started, maybe never listed: nothing either way
        (res(cached=0, prefill=1000), 0, 0),  # listed, no prefix hit expected: the report has it right
        (res(expires_s=100.0), 0, 0),  # expired (a crashed router's)
        # A router from before the prefill fields: never listed, all its tokens until the first token.
        (Reservation(1100, 0.0, TTL), 1100, 0),
        (Reservation(1100, 100.05, TTL), 0, 0),
    ],
)
def test_each_reservation_counts_as_the_rule_says(r: Reservation, unseen: int, listed_done: int) -> None:
    assert prefill_accounting([r], REPORT_S, NOW_S, DELAY_S) == (unseen, listed_done)


def test_reservations_add_up() -> None:
    rs = [res(), res(placed_s=100.05), res(started_s=100.05, cached=0, prefill=3000)]
    # listed_done: 200 (cached) + 3000 (done); unseen: 800
    assert prefill_accounting(rs, REPORT_S, NOW_S, DELAY_S) == (800, 3200)


def _report(queued_prefill: int, received_s: float, seq: int, free: int = 100_000) -> WorkerView:
    cap = Capacity(free, 0, 200_000, 1.0, 0, 1, queued_prefill, 0.0, 10.0, 0, 0)
    return WorkerView("w", "a:1", "m", 1, seq, received_s, received_s, False, cap)


def test_a_request_is_counted_once_from_placement_to_its_first_token() -> None:
    """One 10,000-token prompt, 8,000 of it expected cached (prefix index), 100 new tokens: prefill 2,000."""

    async def scenario() -> None:
        now = [100.0]
        store = MemoryStore(5000, 900.0, clock=lambda: now[0], report_delay_bound_ms=200)
        await store.put_report(_report(0, 100.0, 1))
        assert await store.reserve("w", "r", 10_100, 100.0, prefill_tokens=2_000, cached_tokens=8_000)
        now[0] = 100.1  # the report at 100.0 predates it: only the reservation shows it
        v = store.snapshot().workers[0]
        assert (v.unseen_prefill_tokens, v.listed_done_tokens, queued_prefill_tokens(v)) == (2_000, 0, 2_000)
        assert v.reserved_tokens == 10_100  # headroom still counts the prompt and the output
        # Received at 100.15, within the delay bound: it may list the whole prompt (10,000) or not:
        # both counted, the safe side, for one report interval.
        now[0] = 100.15
        await store.put_report(_report(10_000, 100.15, 2))
        assert queued_prefill_tokens(store.snapshot().workers[0]) == 12_000
        # Received at 100.25 >= 100.0 + 0.2: it lists the whole prompt; the cached 8,000 come off.
        now[0] = 100.25
        await store.put_report(_report(10_000, 100.25, 3))
        v = store.snapshot().workers[0]
        assert (v.unseen_prefill_tokens, v.listed_done_tokens, queued_prefill_tokens(v)) == (0, 8_000, 2_000)
        # First token at 100.3, after that report: the whole prompt is done.
        now[0] = 100.3
        await store.mark_started("w", "r", 100.3)
        v = store.snapshot().workers[0]
        assert (v.listed_done_tokens, queued_prefill_tokens(v)) == (10_000, 0)
        assert v.reserved_tokens == 10_100  # headroom: until a report built after the first token
        # A report from after the first token no longer lists it.
        now[0] = 100.55
        await store.put_report(_report(0, 100.55, 4))
        v = store.snapshot().workers[0]
        assert (v.unseen_prefill_tokens, v.listed_done_tokens, v.reserved_tokens) == (0, 0, 0)

    asyncio.run(scenario())


def test_without_prefill_fields_an_unlisted_reservation_counts_all_its_tokens() -> None:
    async def scenario() -> None:
        now = [100.0]
        store = MemoryStore(5000, 900.0, clock=lambda: now[0])
        await store.put_report(_report(0, 100.0, 1))
        assert await store.reserve("w", "r", 1_100, 100.0)  # prompt and output not told apart
        now[0] = 100.1
        assert queued_prefill_tokens(store.snapshot().workers[0]) == 1_100
        now[0] = 101.0
        await store.put_report(_report(1_000, 101.0, 2))  # lists its prompt: the report alone counts
        assert queued_prefill_tokens(store.snapshot().workers[0]) == 1_000

    asyncio.run(scenario())


# prefill_ms_per_token 0.5, TTFT target 2000 ms, shed_wait_over_ttft 0.25: bound 500 ms.
# The request: 2048 tokens; "holder" holds 3 of its 4 blocks (1536 tokens), "cold" none. The best case
# among the workers the other filters keep is the holder's 1536, so "cold" pays 1536 x .5 = 768 ms extra.
SHED = PlacementConfig(shed_wait_over_ttft=0.25)
TURN = RequestShape("m", 2048, 100, 2000.0, 100.0, prefill_ms_per_token=0.5)
HELD = PrefixMatch(4, (("holder", 3),))


@pytest.mark.parametrize(
    ("queued", "listed_done", "cached", "best", "wait_ms"),
    [
        (1000, 0, 0, 0, 500.0),  # no prefix match: the queue alone, as before
        (1000, 800, 0, 0, 100.0),  # the queue net of the hits of requests the report lists
        (1000, 0, 1536, 1536, 500.0),  # the holder: its own prompt costs no more than the best case
        (1000, 0, 0, 1536, 1268.0),  # a cold worker: + 1536 x .5 it would prefill and the holder not
        (1000, 0, 512, 1536, 1012.0),  # holds 1 block of the 3: + 1024 x .5
        (0, 0, 0, 1536, 768.0),  # idle and cold: the turn's cached prefix is what moving it costs
    ],
)
def test_the_shed_wait_is_the_queue_plus_the_prefill_beyond_the_best_case(
    queued: int, listed_done: int, cached: int, best: int, wait_ms: float
) -> None:
    v = view("w", 50_000, queued_prefill_tokens=queued, listed_done_tokens=listed_done)
    assert shed_wait_ms(v, TURN, cached, best) == pytest.approx(wait_ms)


@pytest.mark.parametrize(
    ("holder_queue", "holder_done", "holder_free", "cold_queue", "ranked", "filtered"),
    [
        # holder 3000 queued, 2500 of it hits of listed requests: 250 ms; cold 0 + 768 ms: dropped
        (3000, 2500, 50_000, 0, ["holder"], {"slo_wait": 1}),
        # the holder is past the bound itself (1500 ms), and moving the turn costs 768 ms: refused
        (3000, 0, 50_000, 0, [], {"slo_wait": 2}),
        # the holder has no headroom: the best case is the cold worker's own (0), it pays no extra
        (0, 0, 1_000, 900, ["cold"], {"headroom": 1}),
        # nobody holds more than the other: the queue alone decides (cold 450 ms, holder 250 ms)
        (500, 0, 50_000, 900, ["holder", "cold"], {}),
    ],
)
def test_the_shed_filter_keeps_the_worker_holding_the_conversation(
    holder_queue: int,
    holder_done: int,
    holder_free: int,
    cold_queue: int,
    ranked: list[str],
    filtered: dict[str, int],
) -> None:
    holder = view(
        "holder",
        holder_free,
        itl_ms=10.0,
        queued_prefill_tokens=holder_queue,
        listed_done_tokens=holder_done,
    )
    cold = view("cold", 50_000, itl_ms=10.0, queued_prefill_tokens=cold_queue)
    prefix = HELD if ranked != ["holder", "cold"] else PrefixMatch(4)
    d = place(Snapshot((holder, cold), 0.0), TURN, SHED, 10_000.0, prefix=prefix)
    assert [c.worker.worker_id for c in d.ranked] == ranked
    assert d.filtered == filtered


def test_without_affinity_the_prefix_match_is_not_read() -> None:
    cfg = PlacementConfig(shed_wait_over_ttft=0.25, weight_prefix_affinity=0.0)
    cold = view("cold", 50_000, queued_prefill_tokens=900)  # 450 ms: kept; with the match it would not be
    d = place(Snapshot((view("holder", 50_000), cold), 0.0), TURN, cfg, 10_000.0, prefix=HELD)
    assert {c.worker.worker_id for c in d.ranked} == {"holder", "cold"}


@pytest.mark.parametrize(
    ("wid", "queued", "unseen", "listed_done", "cached", "ttft_ms"),
    [
        # ttft = step 10 + (queued ahead + own prompt - own cached) x .5; queued ahead = prefill_wait_ms
        ("holder", 3000, 0, 2500, 1536, 10 + (500 + 512) * 0.5),
        ("cold", 900, 300, 0, 0, 10 + (1200 + 2048) * 0.5),
    ],
)
def test_the_ttft_prediction_starts_from_the_filters_count(
    wid: str, queued: int, unseen: int, listed_done: int, cached: int, ttft_ms: float
) -> None:
    v = view(
        wid,
        50_000,
        itl_ms=10.0,
        queued_prefill_tokens=queued,
        unseen_prefill_tokens=unseen,
        listed_done_tokens=listed_done,
    )
    (cand,) = place(Snapshot((v,), 0.0), TURN, PlacementConfig(), 10_000.0, prefix=HELD).ranked
    assert cand.ttft_ms == pytest.approx(ttft_ms)
    assert cand.ttft_ms == pytest.approx(10.0 + prefill_wait_ms(v, TURN) + cand.prefill_tokens(TURN) * 0.5)
    assert cand.cached_tokens == cached  # what the dispatcher's reservation carries
    assert cand.prefill_tokens(TURN) == 2048 - cached


def test_without_affinity_a_candidate_expects_no_cache_hit() -> None:
    v = view("holder", 50_000)
    cfg = PlacementConfig(weight_prefix_affinity=0.0)
    (cand,) = place(Snapshot((v,), 0.0), TURN, cfg, 10_000.0, prefix=HELD).ranked
    assert (cand.cached_tokens, cand.prefill_tokens(TURN)) == (0, 2048)


def test_a_cached_prefix_longer_than_the_prompt_counts_the_prompt() -> None:
    short = RequestShape("m", 1100, 10, 2000.0, 100.0, prefill_ms_per_token=0.5)  # 2 full blocks + 76
    (cand,) = place(
        Snapshot((view("holder", 50_000),), 0.0), short, PlacementConfig(), 10_000.0, prefix=HELD
    ).ranked
    assert cand.cached_tokens == 1100  # 3 x 512 = 1536 > 1100


def test_the_shared_copy_of_a_view_leaves_the_router_side_counts_out() -> None:
    v = with_reservations(_report(1000, 100.0, 1), [res(placed_s=100.05)], NOW_S, DELAY_S)
    assert (v.reserved_tokens, v.unseen_prefill_tokens) == (1100, 800)
    assert view_from_json(view_to_json(v)) == bare(v)
    assert "unseen_prefill_tokens" not in view_to_json(v)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("1100:0:1000.5", Reservation(1100, 0.0, 1000.5)),  # a router from before the prefill fields
        ("1100:100.3:1000.5:800:200:99.5", Reservation(1100, 100.3, 1000.5, 800, 200, 99.5)),
        ("1100:0:1000.5:-:0:99.5", Reservation(1100, 0.0, 1000.5, None, 0, 99.5)),  # prefill not given
    ],
)
def test_shared_reservations_parse_in_both_formats(stored: str, expected: Reservation) -> None:
    assert parse_reservations({"r": stored}) == [expected]


def test_redis_keeps_the_prefill_fields_through_mark_started(tmp_path: Path) -> None:
    port = free_port()
    server = start_redis(tmp_path, port)
    cfg = RouterConfig(
        models=(ModelConfig(name="m"),),
        state=StateConfig(backend="redis", redis_url=f"redis://127.0.0.1:{port}/0"),
        security={"allow_unauthenticated_reports": True},  # type: ignore[arg-type]
    )

    async def scenario() -> None:
        now = [100.0]
        store = RedisStore(cfg, clock=lambda: now[0])
        try:
            await store.put_report(_report(10_000, 100.0, 1))
            assert await store.reserve("w", "r", 10_100, 100.0, prefill_tokens=2_000, cached_tokens=8_000)
            raw = await store._redis.hgetall(store._r("w"))
            assert parse_reservations(raw) == [Reservation(10_100, 0.0, 100.0 + 900.0, 2_000, 8_000, 100.0)]
            await store.mark_started("w", "r", 100.3)
            raw = await store._redis.hgetall(store._r("w"))
            assert parse_reservations(raw) == [Reservation(10_100, 100.3, 1000.0, 2_000, 8_000, 100.0)]
            # A report received at 100.25, listing it, before the first token: the whole prompt is done.
            now[0] = 100.25
            await store.put_report(_report(10_000, 100.25, 2))
            now[0] = 100.35
            await store.refresh()
            v = store.snapshot().workers[0]
            assert (v.listed_done_tokens, queued_prefill_tokens(v), v.reserved_tokens) == (10_000, 0, 10_100)
            # An old router's value: mark_started keeps its three fields.
            await store._redis.hset(store._r("w"), "old", "500:0:1000.0")
            await store.mark_started("w", "old", 100.4)
            assert (await store._redis.hget(store._r("w"), "old")) == "500:100.4:1000.0"
        finally:
            await store.close()

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()
        server.wait(10)

"""Placement table tests: the arithmetic of every expected number is in the comments.

Config defaults used throughout: weight_headroom 1, weight_slo 1, weight_queue 0.5 (sum 2.5),
stale_after 1000 ms, expire_after 5000 ms, idle_itl 10 ms, decode_ms_per_gib 0.25.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement import RequestShape, explain_filtered, place, predict_ms
from zipkv.controlplane.placement.filters import FILTERS, REASON_WORDS, WAIT_FILTER
from zipkv.controlplane.state import Snapshot, WorkerView
from zipkv.protos.capacity import Capacity

NOW = 10_000.0
CFG = PlacementConfig()


CAPACITY_FIELDS = {f.name for f in fields(Capacity)}


def view(wid: str, free: int, total: int = 20_000, *, age_s: float = 0.1, **kw: object) -> WorkerView:
    """A view reporting ``free`` headroom tokens of ``total``; ``kw`` sets view or capacity fields."""
    cap = Capacity(
        headroom_tokens=free,
        committed_tokens=0,
        total_tokens=total,
        compression_ratio=1.0,
        running_requests=0,
        queued_requests=0,
        queued_prefill_tokens=0,
        ttft_ms=0.0,
        itl_ms=0.0,
        max_context_tokens=0,
        kv_bytes_per_token=0,
    )
    cap = replace(cap, **{k: v for k, v in kw.items() if k in CAPACITY_FIELDS})  # type: ignore[arg-type]
    base = WorkerView(wid, f"{wid}:1", "m", 1, 1, NOW - age_s, NOW - age_s, False, cap)
    return replace(base, **{k: v for k, v in kw.items() if k not in CAPACITY_FIELDS})  # type: ignore[arg-type]


def req(prompt: int = 100, new: int = 100, ttft: float = 1000, tpot: float = 100) -> RequestShape:
    return RequestShape("m", prompt, new, ttft, tpot, prefill_ms_per_token=0.5)


def snap(*views: WorkerView) -> Snapshot:
    return Snapshot(tuple(views), NOW)


# need = prompt 500 + max_new 200 = 700 tokens in every row.
@pytest.mark.parametrize(
    ("worker", "dropped_for"),
    [
        (view("old", 10_000, age_s=5.001), "expired"),  # 5001 ms > expire_after 5000 ms
        (view("drain", 10_000, draining=True), "draining"),
        (view("ctx", 10_000, max_context_tokens=512), "context"),  # 700 > 512
        (view("full", 1_000, reserved_tokens=400), "headroom"),  # 1000 - 400 = 600 < 700
        (view("other", 10_000, model="x"), None),  # another model: not a candidate, not a rejection
        (view("exact", 1_100, reserved_tokens=400), "kept"),  # 1100 - 400 = 700 >= 700
        (view("pinned", 10_000, age_s=60, pinned=True), "kept"),  # last known view while Redis is away
    ],
)
def test_filters(worker: WorkerView, dropped_for: str | None) -> None:
    d = place(snap(worker), req(500, 200), CFG, NOW)
    if dropped_for == "kept":
        assert [c.worker.worker_id for c in d.ranked] == [worker.worker_id]
    else:
        assert d.ranked == ()
        assert d.filtered == ({dropped_for: 1} if dropped_for else {})


def test_predictions_follow_the_documented_formulas() -> None:
    # kv_bytes_per_token 2**20 at ratio 0.5 -> 2**19 stored bytes per token.
    # added = (prompt 100 + 100 / 2) * 2**19 bytes = 75 MiB -> tpot = 20 + 75 * 0.25 / 1024 = 20.0183 ms.
    # ttft = 20 + (max(queued_prefill 700 - listed_done 300, 0) + unseen_prefill 600 + prompt 100) * 0.5
    #      = 20 + 1100 * 0.5 = 570 ms; the headroom reservations (reserved_tokens) are no prefill.
    w = view(
        "a",
        10_000,
        itl_ms=20.0,
        kv_bytes_per_token=1 << 20,
        compression_ratio=0.5,
        queued_prefill_tokens=700,
        listed_done_tokens=300,
        unseen_prefill_tokens=600,
        reserved_tokens=5_000,
    )
    ttft, tpot = predict_ms(w, req(), CFG)
    assert ttft == pytest.approx(570.0)
    assert tpot == pytest.approx(20.0 + 75 * 0.25 / 1024)


# A long prompt (4000 + 200 new, TPOT SLO 25 ms, TTFT SLO 2000 ms, prefill 0.05 ms/token), kv 1000 B/token:
#   light: total 20_000, free 19_000 (1e6 bytes used), itl 6 ms; headroom (19000-4200)/20000 = .74
#   busy:  total 100_000, free 80_000 (2e7 bytes used), itl 18 ms; headroom (80000-4200)/100000 = .758
#   added bytes = (4000 + 100) * 1000 = 4.1e6. ttft: light 6 + 4000*.05 = 206 (slack .897), busy 218 (.891).
# tpot = step + 4.1e6 * 0.25 / 2**30: light 6.00095 (slack .76), busy 18.00095 (slack .28)
#   -> light (.74 + .76 + .5) / 2.5 = .80, busy (.758 + .28 + .5) / 2.5 = .615.
# (Dividing the step by the bytes in use, as placement once did, predicted light at 6 + 4.1e6*6/1e6 = 30.6,
#  slack 0, and sent the prompt to the busy worker: .496 against .556.)
def test_a_long_prompt_goes_to_the_fast_worker_not_the_busy_one() -> None:
    light = view("light", 19_000, total=20_000, itl_ms=6.0, kv_bytes_per_token=1000)
    busy = view("busy", 80_000, total=100_000, itl_ms=18.0, kv_bytes_per_token=1000)
    long_prompt = RequestShape("m", 4000, 200, 2000.0, 25.0, prefill_ms_per_token=0.05)
    d = place(snap(busy, light), long_prompt, CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["light", "busy"]
    assert d.ranked[0].score == pytest.approx(0.80, abs=2e-3)
    assert d.ranked[1].score == pytest.approx(0.615, abs=2e-3)


# need 200, TTFT SLO 1000 ms, prefill 0.5 ms/token, both itl 10 ms (tpot slack .9 against 100 ms).
#   a: free 20_000 of 40_000 with 8_000 reserved by this router and not yet in a report (all prefill):
#      headroom (20000-8000-200)/40000 = .295; ttft 10 + (8000 + 100) * .5 = 4060 -> slack 0 -> .318
#   b: free 11_000, nothing reserved: headroom .27; ttft 10 + 100*.5 = 60 -> slo .9 -> (.27+.9+.5)/2.5 = .668
# (Without the reserved prompts in the queue, a predicted 60 ms too and won on headroom, .678: every request
#  of a burst within one report interval went to the same worker.)
def test_prompts_placed_since_the_last_report_count_as_queued_prefill() -> None:
    a = view("a", 20_000, total=40_000, itl_ms=10.0, reserved_tokens=8_000, unseen_prefill_tokens=8_000)
    b = view("b", 11_000, total=40_000, itl_ms=10.0)
    d = place(snap(a, b), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["b", "a"]
    assert d.ranked[0].score == pytest.approx(0.668, abs=1e-3)
    assert d.ranked[1].score == pytest.approx(0.318, abs=1e-3)
    assert d.ranked[1].ttft_ms == pytest.approx(4060.0)


def test_compressed_bytes_drive_the_prior() -> None:
    # Idle worker (no ITL yet): step = idle 10 ms, ms_per_byte = 0.25 / 2**30.
    # kv 2**20 bytes/token; added tokens = 100 + 50 = 150.
    # ratio 1.0: 150 * 2**20 * 0.25 / 2**30 = 0.0366 ms; ratio 0.25: a quarter of that.
    raw = view("raw", 10_000, kv_bytes_per_token=1 << 20, compression_ratio=1.0)
    small = replace(raw, capacity=replace(raw.capacity, compression_ratio=0.25))
    extra_raw = predict_ms(raw, req(), CFG)[1] - 10.0
    extra_small = predict_ms(small, req(), CFG)[1] - 10.0
    assert extra_raw == pytest.approx(150 * 0.25 / 1024)
    assert extra_small == pytest.approx(extra_raw / 4)


def test_slo_slack_beats_raw_headroom() -> None:
    # need 200; kv 1000 B/token at ratio .5: added (100 + 50) * 500 = 75_000 bytes, 75_000 * .25 / 2**30 ms.
    # A: itl 20 -> tpot 20.00002, ttft 20 + 100*.5 = 70.
    #   headroom (10000-200)/20000 = .49; slo min(.93, .8) = .8; queue 1 -> (.49+.8+.5)/2.5 = .716
    # B: itl 90 -> tpot 90.00002; ttft 90 + (400+100)*.5 = 340; headroom (18000-200)/20000 = .89;
    #   slo min(.66, .1) = .1; queue 1/(1+3) = .25 -> (.89 + .1 + .125)/2.5 = .446
    a = view("a", 10_000, itl_ms=20.0, kv_bytes_per_token=1000, compression_ratio=0.5)
    b = view(
        "b",
        18_000,
        itl_ms=90.0,
        kv_bytes_per_token=1000,
        compression_ratio=0.5,
        queued_requests=3,
        queued_prefill_tokens=400,
    )
    d = place(snap(b, a), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["a", "b"]
    assert d.ranked[0].score == pytest.approx(0.716, abs=1e-4)
    assert d.ranked[1].score == pytest.approx(0.446, abs=1e-4)
    assert not d.coarse


def test_headroom_decides_between_idle_workers() -> None:
    # Both idle, same SLO slack and queue; headroom (free - 200) / 20000: .49 vs .24 -> "big" first.
    d = place(snap(view("small", 5_000), view("big", 10_000)), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["big", "small"]
    assert d.ranked[0].headroom == pytest.approx(0.49)
    assert d.ranked[1].headroom == pytest.approx(0.24)


def test_a_new_replica_is_predicted_like_its_fastest_measured_peer() -> None:
    # "warm" measured itl 4 ms (below idle_itl 10 ms); "new" has no measurement yet and more headroom.
    # Without the peer prior "new" would step at 10 ms: tpot slack (100-10)/100 = .9 vs (100-4)/100 = .96.
    # With it both predict tpot 4 ms and ttft 4 + 100 * 0.5 = 54 ms: slack min(.946, .96) = .946 each,
    # so headroom decides: (15000-200)/20000 = .74 against (5000-200)/20000 = .24 -> "new" first.
    warm = view("warm", 5_000, itl_ms=4.0)
    new = view("new", 15_000)
    d = place(snap(warm, new), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["new", "warm"]
    assert d.ranked[0].tpot_ms == pytest.approx(4.0) == d.ranked[1].tpot_ms
    assert d.ranked[0].slo == pytest.approx(d.ranked[1].slo)
    # Alone, an unmeasured worker still steps at placement.idle_itl_ms.
    assert place(snap(new), req(), CFG, NOW).ranked[0].tpot_ms == pytest.approx(CFG.idle_itl_ms)


def test_reservations_count_against_headroom() -> None:
    # "a" reports more free tokens but 6000 of them are already reserved: (12000-6000-200)/20000 = .29
    # against "b": (8000-200)/20000 = .39.
    d = place(snap(view("a", 12_000, reserved_tokens=6_000), view("b", 8_000)), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["b", "a"]


def test_stale_report_switches_everyone_to_the_coarse_signal() -> None:
    # "slow" would lose on SLO (itl 95 ms against a 100 ms TPOT SLO) if its report were fresh, but
    # "stale" is 2 s old, so every candidate is compared on headroom and queue only (weights 1 and .5):
    #   slow:  ((15000-200)/20000 = .74 + .5*1) / 1.5 = .8267
    #   stale: ((10000-200)/20000 = .49 + .5*1) / 1.5 = .66
    slow = view("slow", 15_000, itl_ms=95.0, kv_bytes_per_token=1000)
    stale = view("stale", 10_000, age_s=2.0)
    d = place(snap(slow, stale), req(), CFG, NOW)
    assert d.coarse
    assert [c.worker.worker_id for c in d.ranked] == ["slow", "stale"]
    assert d.ranked[0].score == pytest.approx(0.8267, abs=1e-4)
    assert d.ranked[1].score == pytest.approx(0.66, abs=1e-4)
    fresh = place(snap(slow, replace(stale, received_s=NOW - 0.1)), req(), CFG, NOW)
    assert not fresh.coarse
    assert [c.worker.worker_id for c in fresh.ranked] == ["stale", "slow"]


def test_ties_break_on_worker_id_and_scores_stay_in_unit_range() -> None:
    views = [view(f"w{i}", 10_000) for i in (3, 1, 2)]
    d = place(snap(*views), req(), CFG, NOW)
    assert [c.worker.worker_id for c in d.ranked] == ["w1", "w2", "w3"]
    for c in d.ranked:
        assert 0.0 <= c.score <= 1.0 and 0.0 <= c.slo <= 1.0 and 0.0 <= c.headroom <= 1.0


def test_placement_is_pure() -> None:
    s = snap(view("a", 10_000), view("b", 9_000))
    assert place(s, req(), CFG, NOW) == place(s, req(), CFG, NOW)
    assert s.workers[0].capacity.headroom_tokens == 10_000


@pytest.mark.parametrize(
    ("filtered", "words"),
    [
        ({"headroom": 1}, "1 worker without KV headroom for it"),
        # reasons in name order, counts pluralised
        ({"headroom": 2, "draining": 1}, "1 worker draining, 2 workers without KV headroom for it"),
        (
            {"expired": 3, "slo_wait": 1},
            "3 workers whose reports stopped, 1 worker that would start it past its TTFT SLO",
        ),
        (
            {"context": 1, "too_large": 2},
            "1 worker with a shorter context, 2 workers with a smaller KV budget",
        ),
        ({"new_reason": 1}, "1 worker new_reason"),  # a reason without words keeps its name
        ({}, ""),
    ],
)
def test_a_503_says_in_words_why_each_worker_was_passed_over(filtered: dict[str, int], words: str) -> None:
    assert explain_filtered(filtered) == words


def test_every_filter_reason_has_words() -> None:
    """A filter added without words would show clients its internal name."""
    reasons = {r for r, _ in FILTERS if r is not None} | {WAIT_FILTER[0]}
    assert reasons == set(REASON_WORDS)

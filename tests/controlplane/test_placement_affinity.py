"""The prefix-affinity scorer in `place`: the arithmetic of every expected number is in the comments.

Defaults: weight_headroom 1, weight_slo 1, weight_queue 0.5, weight_prefix_affinity 1 (sum 3.5 when the
request has blocks to match, else 2.5), prefix_block_tokens 512.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_router_placement import NOW, req, snap, view

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement import RequestShape, place
from zipkv.controlplane.placement.scorers import ScoreInput, prefix_affinity
from zipkv.controlplane.prefix_index import PrefixMatch

CFG = PlacementConfig()


@pytest.mark.parametrize(
    ("match", "worker", "expected"),
    [
        (PrefixMatch(4, (("a", 4),)), "a", 1.0),  # served every leading block
        (PrefixMatch(4, (("a", 3), ("b", 1))), "a", 0.75),
        (PrefixMatch(4, (("a", 3), ("b", 1))), "b", 0.25),
        (PrefixMatch(4, (("a", 3),)), "c", 0.0),  # never served any
        (PrefixMatch(0), "a", 0.0),  # a prompt shorter than one block
        (None, "a", 0.0),  # no index
    ],
)
def test_the_scorer_is_the_fraction_of_leading_blocks_served(
    match: PrefixMatch | None, worker: str, expected: float
) -> None:
    s = ScoreInput(view(worker, 10_000), req(), CFG, ttft_ms=60.0, tpot_ms=10.0)
    assert prefix_affinity.score(s, match) == expected


# Both idle, itl 10 ms, need 2048 + 100; b has more headroom: (18000-2148)/20000 = .7926 against
# (10000-2148)/20000 = .3926 for a. ttft: b 10 + 2048 * .5 = 1034 (TTFT SLO 4000: slack .7415),
# a holds 3 of the prompt's 4 blocks (1536 tokens cached): 10 + 512 * .5 = 266 (slack .9335); tpot 10
# (slack .9 against 100) -> slo b .7415, a .9; queue 1 each.
#   without affinity: b (.7926 + .7415 + .5) / 2.5 = .8136, a (.3926 + .9 + .5) / 2.5 = .7170 -> b
#   with it:          b 2.0341 / 3.5 = .5812, a (1.7926 + .75) / 3.5 = .7265 -> a
LONG = RequestShape("m", 2048, 100, 4000.0, 100.0, prefill_ms_per_token=0.5)
HELD_BY_A = PrefixMatch(4, (("a", 3),))


def test_affinity_keeps_a_conversation_on_the_worker_holding_its_prefix() -> None:
    a, b = view("a", 10_000, itl_ms=10.0), view("b", 18_000, itl_ms=10.0)
    cold = place(snap(a, b), LONG, CFG, NOW)
    assert [c.worker.worker_id for c in cold.ranked] == ["b", "a"]
    assert cold.ranked[0].score == pytest.approx(0.8136, abs=1e-4)
    warm = place(snap(a, b), LONG, CFG, NOW, prefix=HELD_BY_A)
    assert [c.worker.worker_id for c in warm.ranked] == ["a", "b"]
    assert warm.ranked[0].affinity == 0.75 and warm.ranked[1].affinity == 0.0
    assert warm.ranked[0].ttft_ms == pytest.approx(266.0)  # its cached blocks skip prefill
    assert warm.ranked[1].ttft_ms == pytest.approx(1034.0)
    assert warm.ranked[0].score == pytest.approx(0.7265, abs=1e-4)
    assert warm.ranked[1].score == pytest.approx(0.5812, abs=1e-4)


def test_weight_zero_ranks_as_without_the_index() -> None:
    off = PlacementConfig(weight_prefix_affinity=0.0)
    a, b = view("a", 10_000, itl_ms=10.0), view("b", 18_000, itl_ms=10.0)
    assert place(snap(a, b), LONG, off, NOW, prefix=HELD_BY_A) == place(snap(a, b), LONG, off, NOW)


def test_a_prompt_without_full_blocks_ranks_as_without_the_index() -> None:
    a, b = view("a", 10_000), view("b", 18_000)
    assert place(snap(a, b), req(), CFG, NOW, prefix=PrefixMatch(0)) == place(snap(a, b), req(), CFG, NOW)


@pytest.mark.parametrize(
    ("holder", "reason", "cfg"),
    [
        # 2148 needed, 2000 of headroom: the holder is filtered out whatever it holds
        (view("a", 2_000, itl_ms=10.0), "headroom", CFG),
        # queued prefill 3000 x .5 = 1500 ms > .25 x 4000 ms: the shed filter drops it
        (
            view("a", 10_000, itl_ms=10.0, queued_prefill_tokens=3000),
            "slo_wait",
            PlacementConfig(shed_wait_over_ttft=0.25),
        ),
    ],
)
def test_affinity_never_brings_back_a_filtered_worker(
    holder: object, reason: str, cfg: PlacementConfig
) -> None:
    # a holds 1 block: b, idle, would prefill 512 tokens more (256 ms), within the shed bound
    b = view("b", 18_000, itl_ms=10.0)
    d = place(snap(holder, b), LONG, cfg, NOW, prefix=PrefixMatch(4, (("a", 1),)))  # type: ignore[arg-type]
    assert [c.worker.worker_id for c in d.ranked] == ["b"]
    assert d.filtered == {reason: 1}


# The holder's load signals are worse by more than the affinity weight: it loses. a holds all 4 blocks
# (nothing of its own to prefill): headroom (2500-2148)/20000 = .0176, ttft 10 + 7000 * .5 = 3510 ->
# slack .1225, queue 1/(1+9) = .1; a = (.0176 + .1225 + .05 + 1.0) / 3.5 = .3400 against
# b = (.7926 + .7415 + .5) / 3.5 = .5812.
def test_a_busy_holder_loses_to_an_idle_peer() -> None:
    a = view("a", 2_500, itl_ms=10.0, queued_requests=9, queued_prefill_tokens=7000)
    b = view("b", 18_000, itl_ms=10.0)
    d = place(snap(a, b), LONG, CFG, NOW, prefix=PrefixMatch(4, (("a", 4),)))
    assert [c.worker.worker_id for c in d.ranked] == ["b", "a"]
    assert d.ranked[1].score == pytest.approx(0.3400, abs=1e-4)


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"weight_prefix_affinity": 2.5}, True),  # = headroom 1 + slo 1 + queue .5
        ({"weight_prefix_affinity": 2.6}, False),  # alone it would outrank every load signal
        ({"weight_prefix_affinity": -1.0}, False),
        ({"prefix_block_tokens": 0}, False),
        ({"prefix_index_blocks": 0}, False),
    ],
)
def test_affinity_config_is_validated_at_start_up(fields: dict[str, float], ok: bool) -> None:
    if ok:
        PlacementConfig(**fields)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValidationError):
            PlacementConfig(**fields)  # type: ignore[arg-type]

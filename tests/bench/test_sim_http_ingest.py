"""The simulation's ingest: requests sent together reach the worker in the order their HTTP bodies arrive
(one TCP receive window first), and bench_serving's warm-up leaves the first prompt cached."""

from __future__ import annotations

import math

import pytest

from bench.serving.serving_metrics import SLOS
from bench.serving.trace_workload import TraceRequest
from bench.sim.http_ingest import ingest_order, json_bytes_per_token, receive_windows
from bench.sim.sim_cluster import simulate
from bench.sim.sim_worker import WorkerSpec
from bench.sim.step_model import StepModel

# The H100 calibration's SGLang model, rounded: the order, not the times, is under test.
STEP = StepModel("sglang", 5.3, 0.39, prefill_ms_per_1k_tokens=19.4, prefill_ms_per_1m_pairs=1.46)
SPEC = WorkerSpec(name="sglang", system="sglang", step=STEP, budget_tokens=388_608)


def request(i: int, input_tokens: int, output_tokens: int = 8) -> TraceRequest:
    blocks = tuple(range(1000 * i, 1000 * i + math.ceil(input_tokens / 512)))  # no shared prefix
    return TraceRequest(i, 0.0, input_tokens, output_tokens, blocks, False)


@pytest.mark.parametrize(
    ("plain_vocab", "want"),
    [
        (10, 1.0 + 2),  # 0..9: one digit, then ", "
        (100, (10 * 1 + 90 * 2) / 100 + 2),
        (128_000, (10 + 90 * 2 + 900 * 3 + 9000 * 4 + 90_000 * 5 + 28_000 * 6) / 128_000 + 2),  # 7.13
    ],
)
def test_json_bytes_per_token(plain_vocab: int, want: float) -> None:
    assert json_bytes_per_token(plain_vocab) == pytest.approx(want)


@pytest.mark.parametrize(
    ("input_tokens", "windows"),
    [  # the sweep's burst: 17,450 tokens (124 KB) arrived in send order, 20,506 (146 KB) late in every run
        (1, 1),
        (16_609, 1),
        (17_450, 1),
        (20_506, 2),
        (26_353, 2),
        (45_922, 3),
        (87_169, 5),
    ],
)
def test_receive_windows(input_tokens: int, windows: int) -> None:
    assert receive_windows(input_tokens, json_bytes_per_token()) == windows


@pytest.mark.parametrize(
    ("inputs", "arrivals", "order"),
    [
        ([6_000, 87_169, 2_000, 20_506, 5_000], [0.0] * 5, [0, 2, 4, 3, 1]),  # one window first, send order
        ([87_169, 45_922, 1_000], [0.0] * 3, [2, 1, 0]),  # of the larger, fewer windows first
        ([87_169, 1_000], [0.0, 0.5], [0, 1]),  # sent earlier: no reordering across instants
        ([3_000, 2_000, 1_000], [0.0] * 3, [0, 1, 2]),  # all one window: send order
    ],
)
def test_ingest_order(inputs: list[int], arrivals: list[float], order: list[int]) -> None:
    assert ingest_order([request(i, n) for i, n in enumerate(inputs)], arrivals) == order


@pytest.mark.parametrize(
    ("inputs", "first_token_order"),
    [
        # the trace's second burst in small: the 87k prompt, sent second, is prefilled last
        ([13_544, 87_169, 6_324, 2_012, 20_506, 16_609], [0, 2, 3, 5, 4, 1]),
        ([26_888, 10_498, 17_450], [1, 2, 0]),  # the first burst: 27k after the two one-window bodies
    ],
)
def test_a_burst_is_prefilled_in_ingest_order(inputs: list[int], first_token_order: list[int]) -> None:
    reqs = [request(i, n) for i, n in enumerate(inputs)]
    res = simulate([SPEC], "round_robin", reqs, [0.0] * len(reqs), SLOS[0], 0.02)
    ttfts = [o.ttft_s for o in res.outcomes]
    # stable on ties: two requests finishing in one prefill batch keep their ingest order
    assert sorted(range(len(reqs)), key=lambda i: (ttfts[i], first_token_order.index(i))) == first_token_order
    assert ttfts[first_token_order[0]] < ttfts[first_token_order[-1]]


@pytest.mark.parametrize(("warm", "prefix_hit_tokens"), [(False, 0), (True, 6_757)])
def test_a_warm_prompt_is_served_from_the_prefix_cache(warm: bool, prefix_hit_tokens: int) -> None:
    first = request(0, 6_758)
    res = simulate([SPEC], "round_robin", [first], [0.0], SLOS[0], 0.02, warm_prompts=[first] if warm else [])
    assert res.prefix_hit_fraction * first.input_tokens == pytest.approx(prefix_hit_tokens)
    # a whole-prompt hit still computes one token (6,757 of 6,758 from the cache): one batch floor
    assert (res.outcomes[0].ttft_s < 0.02) is warm

"""Goodput at both SLOs, percentiles and the knee, from hand-made per-request records in the file format
bench/serving/serving_sweep.py writes (bench_serving's measurements); every expected number is worked out
here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.serving import serving_goodput as sg
from bench.serving.serving_metrics import (
    SLOS,
    Outcome,
    knee_rps,
    percentile,
    rate_row,
    shed_onset_rps,
    sustained_rps,
)


def ok(ttft: float, out: int, gap: float, start: float = 0.0) -> dict[str, Any]:
    gaps = [gap] * (out - 1)
    return {"ok": True, "shed": False, "ttft_s": ttft, "itl_s": gaps, "output_tokens": out,
            "start_s": start, "latency_s": ttft + sum(gaps), "error": ""}  # fmt: skip


SHED = {"ok": False, "shed": True, "ttft_s": 0.0, "itl_s": [], "output_tokens": 0, "start_s": 0.0,
        "latency_s": 0.01, "error": "Service Unavailable: no worker can take this request"}  # fmt: skip


def write(tmp: Path, system: str, rate: float, reqs: list[dict[str, Any]], duration_s: float = 10.0) -> None:
    (tmp / system).mkdir(exist_ok=True)
    rec = {"system": system, "rate_rps": rate, "duration_s": duration_s, "wall_s": duration_s,
           "client": "bench_serving", "workload": {"requests": len(reqs)}, "requests": reqs}  # fmt: skip
    (tmp / system / f"rate_{rate:g}.json").write_text(json.dumps(rec))


@pytest.fixture
def sweep(tmp_path: Path) -> dict[str, Any]:
    # zipkv, rate 1 (4 requests: span 3 s):
    #   r0 ttft .5, 11 tokens, gaps 20 ms -> mean ITL 20: good under both SLOs
    #   r1 ttft 1.5, 5 tokens, gaps 30 ms -> ITL 30 > 25: relaxed only
    #   r2 ttft 3.0, 2 tokens, gap 10 ms -> TTFT 3 > 2: relaxed only
    #   r3 shed (503)
    #   strict 1 good -> 1/3 = .3333 req/s; relaxed 3 -> 1.0 req/s
    write(
        tmp_path, "zipkv", 1.0, [ok(0.5, 11, 0.02, 0.0), ok(1.5, 5, 0.03, 1.0), ok(3.0, 2, 0.01, 2.0), SHED]
    )
    # rate 2 (span 1.5 s): four good at both -> 4 / 1.5 = 2.6667; one is a one-token output (ITL 0).
    write(tmp_path, "zipkv", 2.0, [ok(0.2, 3, 0.01), ok(0.2, 3, 0.01), ok(0.2, 1, 0.0), ok(0.2, 3, 0.01)])
    # rate 4 (span .75 s): strict 2 good -> 2.6667 (a tie with rate 2: the knee is the lower rate);
    #   relaxed 3 good (ttft 4 s passes 5 s) -> 4.0
    write(tmp_path, "zipkv", 4.0, [ok(0.2, 3, 0.01), ok(0.2, 3, 0.01), ok(4.0, 3, 0.01), ok(9.0, 3, 0.01)])
    # sglang_gateway: rate 1: 2 good -> .6667; rate 2: 2 good -> 1.3333 (its knee, both SLOs); rate 4: none.
    write(tmp_path, "sglang_gateway", 1.0, [ok(0.5, 3, 0.01)] * 2 + [ok(6.0, 3, 0.01)] * 2)
    write(tmp_path, "sglang_gateway", 2.0, [ok(0.5, 3, 0.01)] * 2 + [ok(6.0, 3, 0.01)] * 2)
    write(tmp_path, "sglang_gateway", 4.0, [ok(7.0, 3, 0.01)] * 4)
    return sg.build(tmp_path, "test device", "pytest")


def row(report: dict[str, Any], system: str, slo: str, rate: float) -> dict[str, Any]:
    return next(r for r in report["rows"] if (r["system"], r["slo"], r["rate_rps"]) == (system, slo, rate))


def test_goodput_at_both_slos(sweep: dict[str, Any]) -> None:
    strict, relaxed = row(sweep, "zipkv", "strict", 1.0), row(sweep, "zipkv", "relaxed", 1.0)
    assert (strict["good"], strict["goodput_rps"], strict["attainment"]) == (1, pytest.approx(0.3333), 0.25)
    assert (relaxed["good"], relaxed["goodput_rps"], relaxed["attainment"]) == (3, 1.0, 0.75)
    assert strict["shed"] == 1 and strict["completed"] == 3
    assert row(sweep, "zipkv", "strict", 2.0)["goodput_rps"] == pytest.approx(2.6667)
    assert row(sweep, "zipkv", "relaxed", 4.0)["goodput_rps"] == 4.0


def test_percentiles_and_throughput(sweep: dict[str, Any]) -> None:
    r = row(sweep, "zipkv", "strict", 1.0)
    # TTFT over the 3 completed [.5, 1.5, 3]: nearest rank p50 = 2nd = 1.5, p99 = 3rd = 3.0.
    assert (r["ttft_p50_s"], r["ttft_p99_s"]) == (1.5, 3.0)
    # 15 gaps: one of 10 ms, ten of 20, four of 30: p50 = 8th = 20, p99 = 15th = 30.
    assert (r["itl_p50_ms"], r["itl_p99_ms"]) == (20.0, 30.0)
    assert r["output_tokens_per_s"] == (11 + 5 + 2) / 10.0


def test_the_knee_and_the_headline(sweep: dict[str, Any]) -> None:
    assert row(sweep, "zipkv", "strict", 1.0)["knee_rps"] == 2.0  # 2.6667 at 2 and at 4: the lower
    assert row(sweep, "zipkv", "relaxed", 2.0)["knee_rps"] == 4.0
    assert row(sweep, "sglang_gateway", "strict", 4.0)["knee_rps"] == 2.0
    h = sweep["headline"]
    assert h["strict"]["zipkv_over_sglang_gateway"] == pytest.approx(2.6667 / 1.3333, abs=1e-3)
    assert h["relaxed"]["zipkv_over_sglang_gateway"] == pytest.approx(4.0 / 1.3333, abs=1e-3)
    # In flight at the client, sampled each second: r0 [0, .7), r1 [1, 2.62), r2 [2, 5.01), r3 [0, .01).
    assert sweep["in_flight_per_s"]["zipkv"]["1"] == [2, 1, 2, 1, 1, 1]
    keys = {"system", "slo", "rate_rps", "goodput_rps", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms",
            "itl_p99_ms", "output_tokens_per_s", "knee_rps"}  # fmt: skip
    assert all(keys <= set(r) for r in sweep["rows"])
    assert {"device", "date", "command", "client"} <= set(sweep)


def test_sustained_rate_and_shedding() -> None:
    rows = [
        {"rate_rps": 1.0, "attainment": 0.95, "goodput_rps": 0.95, "shed_fraction": 0.0},
        {"rate_rps": 2.0, "attainment": 0.91, "goodput_rps": 1.82, "shed_fraction": 0.02},
        {"rate_rps": 3.0, "attainment": 0.5, "goodput_rps": 1.5, "shed_fraction": 0.4},
        {"rate_rps": 4.0, "attainment": 0.95, "goodput_rps": 3.8, "shed_fraction": 0.0},
    ]
    assert sustained_rps(rows) == 2.0  # 3 drops below 90%; 4 does not count after it
    assert knee_rps(rows) == 4.0 and shed_onset_rps(rows) == 2.0
    assert sustained_rps([{**rows[2], "rate_rps": 0.5}]) is None


def test_weighted_percentile_and_a_failed_request() -> None:
    assert percentile([5.0, 1.0], 50, weights=[1.0, 3.0]) == 1.0  # three gaps of 1 ms, one of 5
    assert percentile([5.0, 1.0], 99, weights=[1.0, 3.0]) == 5.0
    assert percentile([], 50) is None
    outs = [Outcome(ok=False), Outcome(ok=True, ttft_s=0.1, mean_itl_ms=5.0, output_tokens=2)]
    r = rate_row(outs, 1.0, 1.0, SLOS[0], [5.0])
    assert (r["good"], r["completed"], r["shed"], r["goodput_rps"]) == (1, 1, 0, 1.0)

"""Trace windows pooled (bench/serving/serving_windows.py, serving_goodput --pool-windows): hand-made
per-request records of two windows of two systems, every expected number worked out here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.serving import serving_goodput as sg
from bench.serving.serving_windows import pool, pool_all, windows


def ok(ttft: float, out: int = 3, gap: float = 0.01, start: float = 0.0) -> dict[str, Any]:
    gaps = [gap] * (out - 1)
    return {"ok": True, "shed": False, "ttft_s": ttft, "itl_s": gaps, "output_tokens": out,
            "start_s": start, "latency_s": ttft + sum(gaps), "error": ""}  # fmt: skip


def record(
    system: str, rate: float, offset: int, reqs: list[dict[str, Any]], duration_s: float
) -> dict[str, Any]:
    return {"system": system, "rate_rps": rate, "duration_s": duration_s, "wall_s": duration_s + 1.0,
            "client": "bench_serving", "requests": reqs,
            "workload": {"requests": len(reqs), "offset": offset, "max_context_tokens": 1024}}  # fmt: skip


def write(folder: Path, rec: dict[str, Any]) -> None:
    (folder / rec["system"]).mkdir(parents=True, exist_ok=True)
    (folder / rec["system"] / f"rate_{rec['rate_rps']:g}.json").write_text(json.dumps(rec))


def test_a_pooled_record_sums_spans_durations_and_requests() -> None:
    # Window 0: 5 requests at 2 req/s (span 2 s), 10 s; window 5: 3 requests (span 1 s), 6 s.
    a = record("zipkv", 2.0, 0, [ok(0.5)] * 5, 10.0)
    b = record("zipkv", 2.0, 5, [ok(0.5)] * 3, 6.0)
    p = pool([b, a])  # given out of order: pooled in offset order
    assert len(p["requests"]) == 8 and p["span_s"] == 3.0 and p["duration_s"] == 16.0 and p["wall_s"] == 18.0
    assert [w["offset"] for w in windows(p["workload"])] == [0, 5]
    assert (p["workload"]["requests"], p["workload"]["max_context_tokens"]) == (8, 1024)
    assert windows(a["workload"]) == [a["workload"]]  # one window: itself


def test_pooling_refuses_a_repeated_window_another_system_or_other_windows() -> None:
    a = record("zipkv", 1.0, 0, [ok(0.5)] * 3, 5.0)
    with pytest.raises(ValueError, match="a trace window twice"):
        pool([a, dict(a)])
    with pytest.raises(ValueError, match="one system and rate at a time"):
        pool([a, record("sglang_gateway", 1.0, 32, [ok(0.5)] * 3, 5.0)])
    # zipkv ran windows 0 and 32, sglang_gateway only 0: their pooled figures would be different samples
    recs = [
        a,
        record("zipkv", 1.0, 32, [ok(0.5)] * 3, 5.0),
        record("sglang_gateway", 1.0, 0, [ok(0.5)] * 3, 5.0),
    ]
    with pytest.raises(ValueError, match="pool the same windows for all"):
        pool_all(recs)
    capped = record("zipkv", 1.0, 32, [ok(0.5)] * 3, 5.0)
    capped["workload"]["max_context_tokens"] = 2048
    with pytest.raises(ValueError, match="different context caps"):
        pool([a, capped])


def test_the_pooled_table_divides_good_requests_by_the_summed_span(tmp_path: Path) -> None:
    w0, w1 = tmp_path / "w0", tmp_path / "w1"
    # zipkv at 1 req/s: window 0 has 1 strict-good of 4 (span 3 s), window 4 has 3 of 3 (span 2 s):
    #   pooled 4 good / 5 s = 0.8 req/s; alone the windows say 0.3333 and 1.5.
    write(w0, record("zipkv", 1.0, 0, [ok(0.5), ok(3.0), ok(3.0), ok(3.0)], 8.0))
    write(w1, record("zipkv", 1.0, 4, [ok(0.5), ok(1.0), ok(1.5)], 6.0))
    # sglang_gateway at 1 req/s: 2 of 4 and 1 of 3 -> 3 / 5 = 0.6
    write(w0, record("sglang_gateway", 1.0, 0, [ok(0.5), ok(0.5), ok(9.0), ok(9.0)], 8.0))
    write(w1, record("sglang_gateway", 1.0, 4, [ok(0.5), ok(9.0), ok(9.0)], 4.0))
    for system in ("zipkv", "sglang_gateway"):  # 2 req/s: nobody good (TTFT 9 s) in either window
        write(w0, record(system, 2.0, 0, [ok(9.0)] * 4, 4.0))
        write(w1, record(system, 2.0, 4, [ok(9.0)] * 3, 4.0))
    report = sg.build([w0, w1], "test device", "pytest", pool_windows=True)
    strict = {(r["system"], r["rate_rps"]): r for r in report["rows"] if r["slo"] == "strict"}
    z = strict[("zipkv", 1.0)]
    assert (z["requests"], z["good"], z["goodput_rps"]) == (7, 4, 0.8)
    assert z["output_tokens_per_s"] == 1.5  # 7 x 3 tokens over 8 + 6 s
    assert strict[("sglang_gateway", 1.0)]["goodput_rps"] == 0.6
    assert report["headline"]["strict"]["zipkv_over_sglang_gateway"] == pytest.approx(0.8 / 0.6, abs=1e-3)
    alone = [w["headline"]["strict"]["zipkv_goodput_at_knee_rps"] for w in report["windows"]]
    assert alone == [pytest.approx(0.3333, abs=1e-4), 1.5]
    assert set(report["in_flight_per_s"]["zipkv"]) == {"1@offset0", "1@offset4", "2@offset0", "2@offset4"}
    # Without --pool-windows the same folders are two calls measuring one system twice: refused
    with pytest.raises(SystemExit, match="keep one of them"):
        sg.build([w0, w1], "test device", "pytest")
    # Pooled, a window missing for one system is refused with what ran where
    (w1 / "zipkv" / "rate_2.json").unlink()
    with pytest.raises(SystemExit, match=r"--pool-windows: .*pool the same windows for all"):
        sg.build([w0, w1], "test device", "pytest", pool_windows=True)

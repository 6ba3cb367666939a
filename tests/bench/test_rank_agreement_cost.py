"""The agreement-cost bench runs its real gloo reduce between processes and reports per-call times."""

from __future__ import annotations

from pathlib import Path

from bench.allocator.rank_agreement_cost import measure


def test_the_bench_times_the_reduce_across_real_processes(tmp_path: Path) -> None:
    result = measure(ranks=2, calls=20, warmup=2, workdir=tmp_path)
    assert result["ranks"] == 2 and result["calls_per_rank"] == 20
    assert 0 < result["median_us"] <= result["p99_us"] <= result["max_us"]

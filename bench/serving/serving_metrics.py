"""Goodput under SLO, latency percentiles and the knee, from per-request outcomes. Shared by the GPU serving
sweep (bench/serving/serving_goodput.py, from SGLang bench_serving's per-request records) and the cluster
simulation (bench/sim/cluster_sim.py), so both report the same quantities the same way.

Definitions (the tests in tests/bench/test_serving_metrics.py work them by hand):
    good        the request completed and ttft_s <= slo.ttft_s and mean_itl_ms <= slo.mean_itl_ms, where a
                request's mean ITL is (last token time - first token time) / (output_tokens - 1) (0 for a
                one-token output: nothing to wait for between tokens)
    goodput_rps good requests / arrival span, the span being (n - 1) / rate_rps: the offered rate times the
                fraction of requests that were good, so it never exceeds the offered rate
    attainment  good / offered requests (failed and shed requests count as offered, never as good)
    knee_rps    the swept rate where goodput peaks (the lowest one on a tie): past it more offered load
                brings fewer good requests; goodput_at_knee_rps is that peak
    sustained_rps  the highest swept rate up to which every rate keeps attainment >= 0.9 (DistServe's 90%
                SLO attainment); None when even the lowest rate misses it (on this trace the strict SLO
                does at any load: the longest prompts alone take more than 2 s to prefill)
    percentiles nearest rank over completed requests (TTFT) or over every inter-token gap (ITL, as
                bench_serving collects them); the simulation passes gaps with weights (a decode step
                of a batch of B is B gaps of the same length)
    shed        refused at admission (HTTP 429/503: the router or a saturation filter said no)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

KNEE_ATTAINMENT = 0.9


@dataclass(frozen=True, slots=True)
class Slo:
    name: str
    ttft_s: float
    mean_itl_ms: float


SLOS = (Slo("strict", 2.0, 25.0), Slo("relaxed", 5.0, 50.0))


@dataclass(frozen=True, slots=True)
class Outcome:
    """One offered request."""

    ok: bool  # completed with every token
    ttft_s: float = math.inf
    mean_itl_ms: float = math.inf
    output_tokens: int = 0
    shed: bool = False  # refused at admission (never started)


def mean_itl_ms(ttft_s: float, itl_s: Sequence[float], output_tokens: int) -> float:
    """(last - first token) / (tokens - 1), from bench_serving's gaps; 0 for a one-token output."""
    return 0.0 if output_tokens <= 1 else 1000.0 * float(sum(itl_s)) / (output_tokens - 1)


def meets(o: Outcome, slo: Slo) -> bool:
    return o.ok and o.ttft_s <= slo.ttft_s and o.mean_itl_ms <= slo.mean_itl_ms


def percentile(values: Sequence[float], q: float, weights: Sequence[float] | None = None) -> float | None:
    """Nearest-rank q-th percentile (0 < q <= 100), optionally weighted; None when there are no values."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return None
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    k = int(np.searchsorted(cum, q / 100.0 * cum[-1] - 1e-9 * cum[-1], side="left"))
    return float(v[order][min(k, v.size - 1)])


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


def rate_row(
    outcomes: Sequence[Outcome],
    rate_rps: float,
    duration_s: float,
    slo: Slo,
    itl_gaps_ms: Sequence[float],
    itl_weights: Sequence[float] | None = None,
    span_s: float | None = None,
) -> dict[str, object]:
    """The row of one (system or policy, SLO, rate): goodput, percentiles, throughput, shed fraction.
    `span_s`: the arrival span goodput divides by, when it is not one window's (n - 1) / rate_rps (trace
    windows pooled, bench/serving/serving_windows.py)."""
    n = len(outcomes)
    if n < 2:
        raise ValueError("a rate row needs at least two offered requests")
    done = [o for o in outcomes if o.ok]
    good = sum(meets(o, slo) for o in outcomes)
    span_s = (n - 1) / rate_rps if span_s is None else span_s
    ttfts = [o.ttft_s for o in done]
    tokens_per_s = sum(o.output_tokens for o in done) / duration_s if duration_s > 0 else 0.0
    return {
        "slo": slo.name,
        "rate_rps": rate_rps,
        "requests": n,
        "completed": len(done),
        "good": good,
        "attainment": round(good / n, 4),
        "goodput_rps": round(good / span_s, 4),
        "shed": sum(o.shed for o in outcomes),
        "shed_fraction": round(sum(o.shed for o in outcomes) / n, 4),
        "ttft_p50_s": _round(percentile(ttfts, 50), 4),
        "ttft_p99_s": _round(percentile(ttfts, 99), 4),
        "itl_p50_ms": _round(percentile(itl_gaps_ms, 50, itl_weights), 3),
        "itl_p99_ms": _round(percentile(itl_gaps_ms, 99, itl_weights), 3),
        "output_tokens_per_s": round(tokens_per_s, 1),
    }


def knee_rps(rows: Iterable[dict[str, object]]) -> float | None:
    """The rate of peak goodput (module doc); None for no rows."""
    best: tuple[float, float] | None = None
    for row in rows:
        key = (float(row["goodput_rps"]), -float(row["rate_rps"]))  # type: ignore[arg-type]
        if best is None or key > best:
            best = key
    return None if best is None else -best[1]


def sustained_rps(rows: Iterable[dict[str, object]]) -> float | None:
    """Highest rate of the sweep up to which every rate keeps attainment >= 0.9 (module doc)."""
    out: float | None = None
    for row in sorted(rows, key=lambda r: float(r["rate_rps"])):  # type: ignore[arg-type]
        if float(row["attainment"]) < KNEE_ATTAINMENT:  # type: ignore[arg-type]
            break
        out = float(row["rate_rps"])  # type: ignore[arg-type]
    return out


def with_knees(rows: list[dict[str, object]], keys: tuple[str, ...]) -> list[dict[str, object]]:
    """Each row gets its group's `knee_rps`, `goodput_at_knee_rps` and `sustained_rps` (a group: the rows
    sharing `keys`, e.g. one system and SLO across the swept rates)."""
    groups: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for row in rows:
        group = groups[tuple(row[k] for k in keys)]
        knee = knee_rps(group)
        at = next((g["goodput_rps"] for g in group if g["rate_rps"] == knee), None)
        out.append(
            {**row, "knee_rps": knee, "goodput_at_knee_rps": at, "sustained_rps": sustained_rps(group)}
        )
    return out


def shed_onset_rps(rows: Iterable[dict[str, object]], fraction: float = 0.01) -> float | None:
    """The lowest swept rate at which at least `fraction` of the offered requests were shed."""
    shed = [float(r["rate_rps"]) for r in rows if float(r["shed_fraction"]) >= fraction]  # type: ignore[arg-type]
    return min(shed) if shed else None

"""Trace windows pooled into one sample: the serving sweep run over two or more windows of the trace
(OFFSET 0, 32, ...: each window a device call, or a few, of its own) and read as one larger sample per
system and rate.

One window is 32 requests per rate (bench/run_serving_gpu.sh says why); a good-request count that small
moves the knee with a few requests, and two windows of the same trace differ in load (the first 32 requests
average 13.8k input tokens, the next 32 less). Pooling keeps each window's arrivals as they ran and adds
them up:

    goodput_rps   (good requests of every window) / (sum of the windows' arrival spans, (n_w - 1) / rate each)
    output tok/s  (output tokens of every window) / (sum of the windows' durations)
    percentiles   over the requests (TTFT) and the inter-token gaps (ITL) of every window together

so a pooled row is what one sweep of all the windows' requests, run one window after the other, would report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def window_of(record: dict[str, Any]) -> tuple[int, int]:
    """(offset, requests) of a rate record's trace window: what tells two windows apart."""
    w = record["workload"]
    return int(w.get("offset", 0)), int(w["requests"])


def windows(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace windows a results file's `workload` covers: its `windows` when pooled, else itself."""
    return list(workload["windows"]) if "windows" in workload else [workload]


def span_s(record: dict[str, Any]) -> float:
    """The record's arrival span: pooled records carry the sum of theirs; one window's is (n - 1) / rate."""
    if "span_s" in record:
        return float(record["span_s"])
    return (len(record["requests"]) - 1) / float(record["rate_rps"])


def pool(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from one system and rate over distinct trace windows (module doc for what is summed)."""
    if not records:
        raise ValueError("nothing to pool")
    first = records[0]
    for r in records[1:]:
        if (r["system"], float(r["rate_rps"])) != (first["system"], float(first["rate_rps"])):
            raise ValueError(f"pooling {first['system']} at {first['rate_rps']} req/s with {r['system']} at "
                             f"{r['rate_rps']} req/s: pool one system and rate at a time")  # fmt: skip
    keys = [window_of(r) for r in records]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{first['system']} at {first['rate_rps']:g} req/s: a trace window twice ({keys})")
    ordered = sorted(records, key=window_of)
    return {
        **{k: v for k, v in first.items() if k not in ("requests", "duration_s", "wall_s", "workload")},
        "requests": [q for r in ordered for q in r["requests"]],
        "duration_s": sum(float(r.get("duration_s") or r["wall_s"]) for r in ordered),
        "wall_s": sum(float(r["wall_s"]) for r in ordered),
        "span_s": sum(span_s(r) for r in ordered),
        "workload": pooled_workload([r["workload"] for r in ordered]),
    }


def pooled_workload(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The windows of a pooled sample, in offset order, with the request total and the shared context cap."""
    caps = {p.get("max_context_tokens") for p in parts}
    if len(caps) > 1:
        raise ValueError(f"windows with different context caps {sorted(map(str, caps))}: not one workload")
    return {
        "windows": sorted(parts, key=lambda p: int(p.get("offset", 0))),
        "requests": sum(int(p["requests"]) for p in parts),
        "max_context_tokens": caps.pop(),
    }


def pool_all(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (system, rate) pooled over its windows; each must have run in the same windows as every other,
    or a system's pooled figures would come from another sample than its rivals'."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["system"], float(r["rate_rps"])), []).append(r)
    seen = {key: sorted(window_of(r) for r in rs) for key, rs in groups.items()}
    first_key, first_windows = next(iter(seen.items()))
    for key, ws in seen.items():
        if ws != first_windows:
            raise ValueError(
                f"{key[0]} at {key[1]:g} req/s ran windows {ws}, {first_key[0]} at {first_key[1]:g} req/s "
                f"ran {first_windows}: pool the same windows for all"
            )
    return [pool(rs) for _, rs in sorted(groups.items())]

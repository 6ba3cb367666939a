"""Metrics of one SGLang end-to-end run, from the client's token arrival times and SGLang's scheduler log.

Definitions (the row fields of ``bench/results/sglang_e2e.json``):

- ``max_running_requests``: the largest ``#running-req`` of SGLang's "Decode batch" log lines (one every
  ``decode_log_interval`` decode steps; the bench sets 10).
- ``decode_tokens_per_s_at_max_batch``: the median ``gen throughput (token/s)`` of the Decode batch
  lines whose ``#running-req`` equals ``max_running_requests``. Each line covers the last
  ``decode_log_interval`` decode steps (tokens generated / wall time of the interval); the median drops an
  interval that also held a prefill. ``decode_step_ms`` = 1000 x max_running_requests / that throughput:
  the mean decode step time at the largest running batch (each decode step gives one token per request).
- ``decode_tokens_per_s``: the whole decode phase. Every stream chunk a request receives is an arrival event
  (time, new tokens); merging all requests' events in time order, each gap between consecutive events is
  decode time when the later event carries a decode token (any token but a request's first), and prefill
  time otherwise (it ends in first tokens only). decode_tokens_per_s = sum over requests of (tokens - 1) /
  decode time. With every prefill before its decode steps (chunked prefill off) this is the time spent in
  decode steps, as "64 x 255 tokens / decode time" in the H200 baseline runs.
- ``ttft_s_mean``: mean over requests of (first token's arrival - submission); all are submitted at once.
- ``wall_s``: submission to the last token of the last request.
- ``compressed_block_fraction`` (zipkv only): blocks stored compressed over the blocks of compressed pages,
  from zipkv's pool log lines, at the line with the most compressed page blocks (the peak of stored KV).
- ``max_raw_pages_over_running`` (zipkv only): max over the pool lines logged during decode of
  (raw_pages + encoding_pages - 1 padding page - decode_reqs). A request holds one partly written page; a
  page filled in the last step waits one step for its encode, so with every request filling a page in the
  same step this reaches decode_reqs at most. ``compression_keeps_pace``: that bound holds on every line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DECODE_RE = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*?gen throughput \(token/s\): ([0-9.]+)"
    r"(?:, #queue-req: (\d+))?"
)
POOL_RE = re.compile(r"zipkv pool step=(\d+) (.*)")
RETRACT_RE = re.compile(r"#retracted_reqs: (\d+)")
CACHED_RE = re.compile(r"Prefill batch.*?#cached-token: (\d+)")  # radix cache hits (milestone 3)
PAD_PAGES = 1  # zipkv's pool keeps page 0 raw for SGLang's padded CUDA-graph rows


@dataclass(frozen=True)
class DecodeLine:
    running: int
    gen_tokens_per_s: float
    queued: int | None


@dataclass(frozen=True)
class Stream:
    """One request as the client saw it: arrival times (s since submission) and new tokens per chunk."""

    arrival_s: Sequence[float]
    new_tokens: Sequence[int]


def decode_lines(text: str) -> list[DecodeLine]:
    return [
        DecodeLine(int(m[1]), float(m[2]), int(m[3]) if m[3] is not None else None)
        for m in DECODE_RE.finditer(text)
    ]


def pool_lines(text: str) -> list[dict[str, float]]:
    """zipkv's pool lines as {field: number}, ``step`` included."""
    out = []
    for m in POOL_RE.finditer(text):
        fields = {"step": float(m[1])}
        for kv in m[2].split():
            key, _, value = kv.partition("=")
            fields[key] = float(value)
        out.append(fields)
    return out


def at_max_batch(lines: Sequence[DecodeLine]) -> dict[str, Any]:
    if not lines:
        return {
            "max_running_requests": None,
            "decode_tokens_per_s_at_max_batch": None,
            "decode_step_ms": None,
        }
    top = max(x.running for x in lines)
    tput = statistics.median(x.gen_tokens_per_s for x in lines if x.running == top)
    return {
        "max_running_requests": top,
        "decode_tokens_per_s_at_max_batch": round(tput, 1),
        "decode_step_ms": round(1e3 * top / tput, 3) if tput > 0 else None,
        "decode_lines_at_max_batch": sum(x.running == top for x in lines),
    }


def decode_phase(streams: Sequence[Stream]) -> dict[str, Any]:
    """Decode tokens and decode time over the merged arrival events (module docstring)."""
    events: list[tuple[float, int]] = []  # (time, decode tokens in the chunk)
    for s in streams:
        seen = 0
        for t, n in zip(s.arrival_s, s.new_tokens, strict=True):
            if n <= 0:
                continue
            events.append((t, n - (1 if seen == 0 else 0)))
            seen += n
    events.sort()
    decode_s = sum(t - prev for (prev, _), (t, d) in itertools.pairwise(events) if d > 0)
    decode_tokens = sum(max(sum(s.new_tokens) - 1, 0) for s in streams)
    return {
        "decode_tokens": decode_tokens,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(decode_tokens / decode_s, 1) if decode_s > 0 else None,
    }


def client_metrics(streams: Sequence[Stream]) -> dict[str, Any]:
    firsts = [
        next((t for t, n in zip(s.arrival_s, s.new_tokens, strict=True) if n > 0), None) for s in streams
    ]
    ttfts = [t for t in firsts if t is not None]
    ends = [s.arrival_s[-1] for s in streams if s.arrival_s]
    return {
        "requests": len(streams),
        "requests_without_tokens": len(streams) - len(ttfts),
        "output_tokens": sum(sum(s.new_tokens) for s in streams),
        "ttft_s_mean": round(statistics.fmean(ttfts), 4) if ttfts else None,
        "ttft_s_max": round(max(ttfts), 4) if ttfts else None,
        "wall_s": round(max(ends), 4) if ends else None,
        **decode_phase(streams),
    }


def pool_metrics(lines: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Compressed-block fraction and whether compression kept pace (module docstring); {} without lines."""
    if not lines:
        return {}
    peak = max(lines, key=lambda x: x.get("compressed_page_blocks", 0.0))
    blocks = peak.get("compressed_page_blocks", 0.0)
    out: dict[str, Any] = {
        "compressed_block_fraction": round(peak["compressed_blocks"] / blocks, 4) if blocks else None,
        "compressed_pages_at_peak": int(peak["compressed_pages"]),
        "compression_ratio_at_peak": peak.get("ratio"),
        "pool_lines": len(lines),
    }
    if any("refresh_headroom_host_ms" in x for x in lines):  # tensor parallelism: what agreeing cost
        out["agreement_host_ms"] = round(sum(x.get("refresh_headroom_host_ms", 0.0) for x in lines), 1)
        out["alloc_host_ms"] = round(sum(x.get("alloc_host_ms", 0.0) for x in lines), 1)
    decoding = [x for x in lines if x.get("decode_reqs", 0.0) > 0]
    if decoding:
        excess = [x["raw_pages"] + x["encoding_pages"] - PAD_PAGES - x["decode_reqs"] for x in decoding]
        out["max_raw_pages_over_running"] = int(max(excess))
        out["raw_pages_over_running_first_last"] = [int(excess[0]), int(excess[-1])]
        out["compression_keeps_pace"] = all(
            e <= x["decode_reqs"] for e, x in zip(excess, decoding, strict=True)
        )
    return out


def log_metrics(text: str) -> dict[str, Any]:
    errors = [ln for ln in text.splitlines() if "Traceback" in ln or re.search(r"\b\w*Error\b", ln)]
    return {
        **at_max_batch(decode_lines(text)),
        **pool_metrics(pool_lines(text)),
        "retracted_requests": sum(int(x) for x in RETRACT_RE.findall(text)),
        "cached_prefill_tokens": sum(int(x) for x in CACHED_RE.findall(text)),
        "first_error_lines": errors[:5],
    }


def request_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def compare_outputs(a: Sequence[str] | None, b: Sequence[str] | None) -> dict[str, Any]:
    """Per-request digests of two systems' greedy outputs, request by request."""
    if not a or not b:
        return {"identical": None, "why": "one of the two systems has no outputs in this file"}
    if len(a) != len(b):
        return {"identical": False, "why": f"{len(a)} vs {len(b)} requests"}
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return {
        "identical": not differ,
        "requests": len(a),
        "requests_differing": len(differ),
        "differing": differ[:16],
    }


def summarize(results: dict[str, Any]) -> None:
    """Cross-row fields: greedy identity and zipkv / FlashInfer ratios, per workload and milestone."""
    by = {(r["system"], r["workload"], r["milestone"]): r for r in results["rows"]}
    same, ratios = {}, {}
    for workload, milestone in sorted({(r["workload"], r["milestone"]) for r in results["rows"]}):
        key = workload if milestone == "m2" else f"{workload}:{milestone}"
        z, u, f = (
            by.get((s, workload, milestone), {}) for s in ("zipkv", "zipkv_uncompressed", "flashinfer")
        )
        same[key] = compare_outputs(z.get("request_sha256"), u.get("request_sha256"))
        ratio = {}
        for m in ("decode_tokens_per_s_at_max_batch", "decode_tokens_per_s"):
            if z.get(m) and f.get(m):
                ratio[m] = round(z[m] / f[m], 4)
        if ratio:
            ratios[key] = ratio
    results["greedy_tokens_identical"] = same
    results["zipkv_over_flashinfer"] = ratios


def print_table(results: dict[str, Any]) -> None:
    cols: tuple[str, ...] = ("rc", "max_running_requests", "decode_tokens_per_s_at_max_batch")
    cols += ("decode_tokens_per_s", "decode_step_ms")
    cols += ("ttft_s_mean", "wall_s", "compressed_block_fraction", "max_raw_pages_over_running")
    for r in results["rows"]:
        for line in r.get("first_error_lines", [])[:2]:
            print(f"{r['system']} {r['workload']}: {line[:160]}")
    short = ("rc", "max_run", "tok/s@max", "tok/s", "step_ms", "ttft_s", "wall_s", "cbf", "raw-run")
    print(f"{'system':19} {'workload':17} " + " ".join(f"{c:>9}" for c in short))
    for r in results["rows"]:
        cells = " ".join(f"{r.get(c, '-')!s:>9}" for c in cols)
        print(f"{r['system']:19} {r['workload']:17} {cells}")
    print("greedy_tokens_identical:", json.dumps(results["greedy_tokens_identical"]))
    print("zipkv_over_flashinfer:", json.dumps(results["zipkv_over_flashinfer"]))

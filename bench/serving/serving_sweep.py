"""Sweep one running system over request rates with SGLang's bench_serving (serving_client.py).

    python -m bench.serving.serving_sweep --system zipkv --base-url http://127.0.0.1:8000 --model llama \\
        --tokenizer /tmp/id_tokenizer --rates 0.5,1,2 --requests 48 --out-dir $OUT/serving

For each rate: the same trace window (`--offset`, `--requests`), its arrivals scaled to the rate, prompts
salted with the rate's index (no rate reuses another's prefix cache, on any system). A short warm-up
first (its own salt, not recorded) so JIT compiles and CUDA graph captures are not timed. Each rate's
per-request record goes to OUT_DIR/SYSTEM/rate_R.json; serving_goodput.py turns them into the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.serving.serving_client import (
    API_PATHS,
    BACKEND,
    bench_args,
    dataset_rows,
    import_bench_serving,
    run_rate,
)
from bench.serving.trace_workload import (
    LLAMA3_CONTEXT_TOKENS,
    LLAMA3_PLAIN_VOCAB,
    TraceRequest,
    arrivals_s,
    load_trace,
    summary,
)

WARMUP_SALT = 10_000


def starts_in_time(elapsed_s: float, span_s: float, drain_s: float, deadline_s: float) -> bool:
    """Whether a rate whose arrivals span `span_s` ends before `deadline_s` (0: no deadline): it starts at
    `elapsed_s` and drains like the slowest rate so far (`drain_s`: its wall time past its arrivals).
    Counting only the span started a rate the caller's timeout then killed midway, losing its record."""
    return deadline_s <= 0 or elapsed_s + span_s + drain_s <= deadline_s


def scrape_placements(url: str, metric: str) -> dict[str, float] | None:
    """The per-worker counter now (cumulative: a rate's split is its difference from the rate before);
    None when there is nothing to read or the read failed (the rate's record says so, the sweep goes on)."""
    if not url or not metric:
        return None
    from bench.serving.serving_systems import placements
    from zipkv.stack.local_http import http_get

    try:
        code, body = http_get(url, 5.0)
    except OSError:
        return None
    return placements(body.decode(errors="replace"), metric) if code == 200 else None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.serving.serving_sweep", description=__doc__.split("\n")[0]
    )
    p.add_argument("--system", required=True, help="a serving_systems.SYSTEMS name (the record's folder)")
    p.add_argument("--backend", choices=sorted(API_PATHS), default=BACKEND, help="bench_serving's backend")
    p.add_argument("--base-url", required=True, help="the system's OpenAI endpoint, without /v1")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--tokenizer", required=True, help="folder of bench/serving/id_tokenizer.py's tokenizer")
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], required=True)
    p.add_argument("--requests", type=int, default=48, help="trace requests per rate")
    p.add_argument("--offset", type=int, default=0, help="first trace request")
    p.add_argument("--max-context-tokens", type=int, default=LLAMA3_CONTEXT_TOKENS)
    p.add_argument("--plain-vocab", type=int, default=LLAMA3_PLAIN_VOCAB, help="prompt ids are below this")
    p.add_argument("--placements-url", default="", help="Prometheus text counting requests per worker")
    p.add_argument("--placements-metric", default="", help="that counter's name")
    p.add_argument("--warmup-requests", type=int, default=4)
    p.add_argument("--deadline-s", type=float, default=0.0, help="skip rates that would start after this")
    p.add_argument("--out-dir", type=Path, required=True)
    return p.parse_args(argv)


WARMUP_PASSES = 2  # the first compiles and captures; the second's drain is the first rate's estimate


def _warm_up(
    serving: Any, bargs: argparse.Namespace, reqs: list[TraceRequest], args: argparse.Namespace, t0: float
) -> float:
    """A few short requests under their own salt, not recorded, so that JIT compiles and CUDA graph captures
    fall before the timed rates; returns the drain (wall time past the arrivals) of the last of
    WARMUP_PASSES passes, the estimate the first rate is admitted by. A single pass's drain included
    SGLang's cold JIT (about 110 s on the H100 sweep of 2026-12-06), which skipped its 1 req/s rate."""
    warm = reqs[: args.warmup_requests]
    drain_s = 0.0
    for k in range(WARMUP_PASSES):
        rows = dataset_rows(
            serving, warm, [0.25 * i for i in range(len(warm))], args.plain_vocab, WARMUP_SALT + k
        )
        for row in rows:
            row.output_len = min(row.output_len, 16)
        started = time.monotonic()
        got = run_rate(serving, bargs, rows)
        drain_s = time.monotonic() - started - 0.25 * (len(warm) - 1)
        print(
            f"[serving_sweep {args.system}] warm-up pass {k + 1}: "
            f"{sum(bool(r and r['ok']) for r in got['requests'])}/{len(rows)} ok, drain {drain_s:.1f} s, "
            f"{time.monotonic() - t0:.0f} s in",
            flush=True,
        )
    return drain_s


def _rate_record(
    args: argparse.Namespace,
    k: int,
    rate: float,
    started: float,
    got: dict[str, Any],
    workload: dict[str, Any],
    shimmed: bool,
) -> dict[str, Any]:
    """Rate k's record (OUT_DIR/SYSTEM/rate_R.json, what serving_goodput.py reads), its run just ended."""
    return {
        "system": args.system,
        "rate_rps": rate,
        "salt": k + 1,
        "duration_s": got["bench_serving"].get("duration"),
        "wall_s": round(time.monotonic() - started, 2),
        "client": f"sglang.benchmark.serving 0.5.17 (bench_serving), backend {args.backend}"
        + (" (CPU import shim)" if shimmed else ""),
        "workload": workload,
        "bench_serving": got["bench_serving"],
        "requests": got["requests"],
        "placements_after": scrape_placements(args.placements_url, args.placements_metric),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    t0 = time.monotonic()
    serving, shimmed = import_bench_serving()
    out = args.out_dir / args.system
    out.mkdir(parents=True, exist_ok=True)
    reqs = load_trace(args.max_context_tokens, args.requests, args.offset)
    workload = {**summary(reqs), "offset": args.offset, "max_context_tokens": args.max_context_tokens}
    bargs = bench_args(
        serving, args.base_url, args.model, args.tokenizer, out / "bench_serving.jsonl", args.backend
    )
    # The drain a rate is expected to take: the slowest wall time past the arrivals of the rates so far;
    # before the first, the warm-up's (an over-estimate where it compiles kernels, replaced once a rate ran).
    drain_s, measured = 0.0, False
    if args.warmup_requests > 0:
        drain_s = _warm_up(serving, bargs, reqs, args, t0)
    for k, rate in enumerate(args.rates):
        expected_s = (len(reqs) - 1) / rate
        if not starts_in_time(time.monotonic() - t0, expected_s, drain_s, args.deadline_s):
            print(
                f"[serving_sweep {args.system}] skipping {rate} req/s: {expected_s:.0f} s of arrivals + "
                f"{drain_s:.0f} s of drain would end past --deadline-s",
                flush=True,
            )
            continue
        rows = dataset_rows(serving, reqs, arrivals_s(reqs, rate), args.plain_vocab, salt=k + 1)
        started = time.monotonic()
        got = run_rate(serving, bargs, rows)
        record = _rate_record(args, k, rate, started, got, workload, shimmed)
        (out / f"rate_{rate:g}.json").write_text(json.dumps(record) + "\n")
        drain_s = max(drain_s if measured else 0.0, record["wall_s"] - expected_s)
        measured = True
        ok = sum(bool(r and r["ok"]) for r in got["requests"])
        print(
            f"[serving_sweep {args.system}] {rate:g} req/s: {ok}/{len(rows)} completed, {record['wall_s']} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

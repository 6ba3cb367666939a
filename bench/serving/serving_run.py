"""One system of the serving sweep, start to stop: the id tokenizer, the system, the rate sweep, a record.

    python -m bench.serving.serving_run --system zipkv --engine sglang --model .carry/llama31_8b \\
        --rates 0.5,1,2,4 --requests 48 --out-dir $OUT/serving            # on the GPU machine
    python -m bench.serving.serving_run --system zipkv --engine reference --max-context-tokens 1024 \\
        --rates 0.5,1 --requests 8 --out-dir /tmp/serving                   # the same path on a CPU
    python -m bench.serving.serving_run --system sglang_gateway_cache_aware --replicas 2 ...  # two GPUs

The sweep runs as its own process (bench/serving/serving_sweep.py, SGLang's bench_serving) under a deadline;
OUT_DIR/SYSTEM/system.json records what ran (flags, start-up times, the stand-in when there is one);
bench/serving/serving_goodput.py reads the rate files next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.serving.id_tokenizer import build as build_tokenizer
from bench.serving.serving_systems import SYSTEMS, Running, client_backend, start
from bench.serving.trace_workload import KV_BYTES_PER_TOKEN, load_trace, native_rate_rps
from zipkv.stack.options import kernel_choices

TINY_VOCAB = 259  # the built-in tiny model's (controlplane/tokenizer.py ByteTokenizer)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.serving.serving_run", description=__doc__.split("\n")[0]
    )
    p.add_argument("--system", required=True, choices=SYSTEMS)
    p.add_argument("--replicas", type=int, default=1, help="workers, one GPU each (the KV budget: each's)")
    p.add_argument(
        "--gpus", type=int, default=None, help="GPUs the replicas share (default: one each; must divide them)"
    )
    p.add_argument("--engine", choices=["sglang", "reference"], default="sglang")
    p.add_argument("--model", default="", help="model folder with config.json (empty: the tiny model)")
    p.add_argument("--kv-budget-mib", type=float, default=48576.0, help="KV memory, raw (388,608 tokens)")
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--max-context-tokens", type=int, default=131072)
    p.add_argument(
        "--sglang-args", default="{}", help="JSON: SGLang server / Engine arguments for every system"
    )
    p.add_argument("--rates", required=True)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--ready-s", type=float, default=400.0)
    p.add_argument("--deadline-s", type=float, default=560.0, help="for the whole run, start to stop")
    p.add_argument("--out-dir", type=Path, required=True)
    return p.parse_args(argv)


def _vocab(model: str) -> int:
    if not model:
        return TINY_VOCAB
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def _options(args: argparse.Namespace, tok: Path) -> dict[str, Any]:
    """What serving_systems.start gets, and system.json records, from the command line."""
    return {
        "engine": args.engine,
        "model": args.model,
        "kv_budget_mib": args.kv_budget_mib,
        "budget_tokens": int(args.kv_budget_mib * (1 << 20)) // KV_BYTES_PER_TOKEN,
        "max_context_tokens": args.max_context_tokens,
        "max_running": args.max_running,
        "sglang_args": json.loads(args.sglang_args),
        "tokenizer": str(tok),
        "ready_s": args.ready_s,
        "replicas": args.replicas,
        "gpus": args.gpus,
        "kernel_env": kernel_choices(os.environ),  # e.g. ZIPKV_PREFILL_KERNEL, as the replicas get it
    }


def _sweep_cmd(args: argparse.Namespace, run: Running, tok: Path, vocab: int, left: float) -> list[str]:
    """serving_sweep.py against the running system, with `left` seconds of the run's deadline."""
    return [
        sys.executable,
        "-m",
        "bench.serving.serving_sweep",
        "--system",
        args.system,
        "--base-url",
        run.base_url,
        "--model",
        run.model,
        "--tokenizer",
        str(tok),
        "--backend",
        client_backend(args.system),
        "--placements-url",
        run.placements_url,
        "--placements-metric",
        run.placements_metric,
        "--rates",
        args.rates,
        "--requests",
        str(args.requests),
        "--offset",
        str(args.offset),
        "--max-context-tokens",
        str(args.max_context_tokens),
        "--plain-vocab",
        str(min(vocab, 128000)),
        "--deadline-s",
        str(max(left - 30, 1)),
        "--out-dir",
        str(args.out_dir),
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    t0 = time.monotonic()
    out = args.out_dir / args.system
    out.mkdir(parents=True, exist_ok=True)
    # A window the sweep cannot scale to a rate (all at one trace time) fails now, not after the start-up.
    native_rate_rps(load_trace(args.max_context_tokens, args.requests, args.offset))
    vocab = _vocab(args.model)
    tok = build_tokenizer(vocab, args.out_dir / "id_tokenizer")
    opts = _options(args, tok)
    record: dict[str, Any] = {"system": args.system, "options": opts, "argv": sys.argv[1:]}
    run = start(args.system, opts, out)
    record.update(base_url=run.base_url, note=run.note, startup_s=run.timings_s)
    print(f"[serving_run {args.system}] up in {time.monotonic() - t0:.0f} s: {run.note}", flush=True)
    try:
        left = args.deadline_s - (time.monotonic() - t0) - 20  # 20 s to stop
        rc = subprocess.run(_sweep_cmd(args, run, tok, vocab, left), timeout=max(left, 1)).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    finally:
        run.stop()
    record.update(sweep_rc=rc, wall_s=round(time.monotonic() - t0, 1))
    (out / "system.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"[serving_run {args.system}] done (sweep rc {rc}) in {record['wall_s']} s", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

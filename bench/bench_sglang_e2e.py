"""SGLang end to end on the H200: zipkv against SGLang's FlashInfer and Triton backends, one run.

Workload (the ZipFusion setup): Llama-3.1-8B shape with dummy weights, 64 requests submitted at once,
8192 random input ids each, 256 new tokens (ignore_eos), temperature 0. KV budget: max_total_tokens =
46 * 8448 for the uncompressed systems; zipkv gets the same bytes (its pool budget is max_total_tokens x
the uncompressed bytes per token, and it may hold more tokens in them).

Systems: ``flashinfer``, ``triton`` (SGLang's backends), ``zipkv`` and ``zipkv_uncompressed`` (the same pool
and kernel with compression off). Every system runs in its own process under ``timeout``; all use the same
flags (milestone ``m2``: decode CUDA graphs and the overlap scheduler on, radix cache and chunked prefill
off, prefill CUDA graph off). Greedy outputs of zipkv and zipkv_uncompressed must be identical.

    python bench/bench_sglang_e2e.py --model DIR --out bench/results/sglang_e2e.json      # all systems
    python bench/bench_sglang_e2e.py --model DIR --child zipkv --milestone m1 --json x.json  # one, small
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SYSTEMS = ("zipkv", "zipkv_uncompressed", "triton", "flashinfer")
MILESTONES: dict[str, dict[str, Any]] = {
    "m1": {
        "disable_cuda_graph": True,
        "disable_overlap_schedule": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
    },
    "m2": {
        "disable_prefill_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "cuda_graph_max_bs_decode": 64,
    },
    "m3": {"disable_prefill_cuda_graph": True, "chunked_prefill_size": 2048, "cuda_graph_max_bs_decode": 64},
}
BUDGET_TOKENS = 46 * 8448


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one system in this process: start SGLang, warm up, time the workload."""
    import numpy as np
    import sglang

    if args.child.startswith("zipkv"):
        from zipkv.worker.sglang_seams import engine_class

        engine_cls: Any = engine_class()
    else:
        engine_cls = sglang.Engine
    kwargs = dict(
        model_path=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend=args.child,
        page_size=16,
        dtype="bfloat16",
        max_total_tokens=args.budget_tokens,
        mem_fraction_static=0.85,
        sampling_backend="pytorch",
        grammar_backend="none",
        log_level="info",
        random_seed=0,
        **MILESTONES[args.milestone],
    )
    t0 = time.perf_counter()
    eng = engine_cls(**kwargs)
    start_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompts = rng.integers(100, 120000, size=(args.requests, args.input_tokens)).tolist()
    sp = {"max_new_tokens": args.output_tokens, "temperature": 0.0, "ignore_eos": True}
    eng.generate(input_ids=[p[:256] for p in prompts[:2]], sampling_params={**sp, "max_new_tokens": 8})

    async def one(i: int, t_submit: float) -> dict[str, Any]:
        first, ids, end = None, [], t_submit
        stream = await eng.async_generate(input_ids=prompts[i], sampling_params=sp, stream=True)
        async for out in stream:
            end = time.perf_counter()
            if first is None and out.get("output_ids"):
                first = end
            ids = list(out["output_ids"])
        return {"ttft_s": (first or end) - t_submit, "end_s": end - t_submit, "ids": ids}

    async def run_all() -> list[dict[str, Any]]:
        t_submit = time.perf_counter()
        return list(await asyncio.gather(*(one(i, t_submit) for i in range(args.requests))))

    res = eng.loop.run_until_complete(run_all())
    eng.shutdown()
    wall = max(r["end_s"] for r in res)
    n_out = sum(len(r["ids"]) for r in res)
    itl = [(r["end_s"] - r["ttft_s"]) / max(len(r["ids"]) - 1, 1) for r in res]
    digest = hashlib.sha256(json.dumps([r["ids"] for r in res]).encode()).hexdigest()
    return {
        "system": args.child,
        "milestone": args.milestone,
        "engine_start_s": round(start_s, 1),
        "wall_s": round(wall, 3),
        "output_tokens": n_out,
        "output_tok_s": round(n_out / wall, 1),
        "ttft_mean_s": round(sum(r["ttft_s"] for r in res) / len(res), 3),
        "ttft_max_s": round(max(r["ttft_s"] for r in res), 3),
        "itl_mean_ms": round(1e3 * sum(itl) / len(itl), 3),
        "outputs_sha256": digest,
        "first_request_ids": res[0]["ids"][:16],
        "kwargs": {k: v for k, v in kwargs.items() if k != "model_path"},
    }


def parse_log(text: str) -> dict[str, Any]:
    """Peak running requests (SGLang's scheduler log) and zipkv's last pool line."""
    running = [int(x) for x in re.findall(r"Decode batch, #running-req: (\d+)", text)]
    gen = [float(x) for x in re.findall(r"gen throughput \(token/s\): ([0-9.]+)", text)]
    out: dict[str, Any] = {
        "max_running_requests": max(running) if running else None,
        "peak_gen_tok_s": max(gen) if gen else None,
    }
    pool = re.findall(r"zipkv pool step=\d+ (.*)", text)
    if pool:
        out["zipkv_pool_last"] = dict(kv.split("=") for kv in pool[-1].split())
    errors = [ln for ln in text.splitlines() if "Error" in ln or "Traceback" in ln]
    if errors:
        out["first_error_lines"] = errors[:5]
    return out


def parent(args: argparse.Namespace) -> None:
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "workload": {
            "requests": args.requests,
            "input_tokens": args.input_tokens,
            "output_tokens": args.output_tokens,
            "budget_tokens": args.budget_tokens,
        },
        "systems": {},
    }
    deadline = time.monotonic() + args.deadline_s
    for run in args.runs.split(","):
        system, milestone, *size = run.split(":")
        small = size == ["small"]
        left = int(deadline - time.monotonic()) - 5
        if left < 30:
            print(f"{run}: skipped, {left}s left", flush=True)
            continue
        name = f"{system}-{milestone}" + ("-small" if small else "")
        js, log = logs / f"{name}.json", logs / f"{name}.log"
        work = (8, 1024, 32) if small else (args.requests, args.input_tokens, args.output_tokens)
        cmd = [
            "timeout",
            str(min(args.timeout_s, left)),
            sys.executable,
            __file__,
            "--child",
            system,
            "--json",
            str(js),
            "--model",
            args.model,
            "--milestone",
            milestone,
            "--requests",
            str(work[0]),
            "--input-tokens",
            str(work[1]),
            "--output-tokens",
            str(work[2]),
            "--budget-tokens",
            str(args.budget_tokens),
        ]
        t0 = time.perf_counter()
        with open(log, "w") as f:
            # Own process group: SGLang's scheduler and detokenizer processes die with it, even on a timeout,
            # so the next system starts on a free GPU.
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            rc = proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(2)
        entry = json.loads(js.read_text()) if js.exists() else {"system": system, "milestone": milestone}
        entry.update(
            rc=rc, process_s=round(time.perf_counter() - t0, 1), small=small, **parse_log(log.read_text())
        )
        results["systems"][name] = entry
        print(f"{name}: rc={rc} {time.perf_counter() - t0:.0f}s", flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    s = results["systems"]
    if all(s.get(k, {}).get("outputs_sha256") for k in ("zipkv", "zipkv_uncompressed")):
        results["zipkv_equals_uncompressed_twin"] = (
            s["zipkv"]["outputs_sha256"] == s["zipkv_uncompressed"]["outputs_sha256"]
        )
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"{'system':20} {'rc':>3} {'wall s':>8} {'tok/s':>8} {'ttft s':>7} {'itl ms':>7} {'max run':>7}")
    for name, e in s.items():
        print(
            f"{name:20} {e.get('rc')!s:>3} {e.get('wall_s', '-')!s:>8} {e.get('output_tok_s', '-')!s:>8} "
            f"{e.get('ttft_mean_s', '-')!s:>7} {e.get('itl_mean_ms', '-')!s:>7} "
            f"{e.get('max_running_requests')!s:>7}"
        )
    print("zipkv == uncompressed twin:", {k: v for k, v in results.items() if k.startswith("zipkv_equals")})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="folder with the model's config.json (dummy weights)")
    p.add_argument("--child", choices=SYSTEMS, help="run one system in this process")
    p.add_argument("--json", help="child: where to write its result")
    p.add_argument(
        "--runs",
        default=",".join(f"{x}:m2" for x in SYSTEMS),
        help="comma-separated SYSTEM:MILESTONE[:small] (small: 8 requests x 1024 -> 32 tokens)",
    )
    p.add_argument("--deadline-s", type=int, default=3600, help="all runs together")
    p.add_argument("--milestone", choices=tuple(MILESTONES), default="m2")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-tokens", type=int, default=8192)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--budget-tokens", type=int, default=BUDGET_TOKENS)
    p.add_argument("--timeout-s", type=int, default=240, help="per system process")
    p.add_argument("--logs", default=os.environ.get("OUT", ".") + "/sglang_e2e_logs")
    p.add_argument("--out", default="bench/results/sglang_e2e.json")
    args = p.parse_args()
    if args.child:
        Path(args.json).write_text(json.dumps(child(args), indent=1))
    else:
        parent(args)


if __name__ == "__main__":
    main()

"""SGLang end to end on the H200: zipkv against SGLang's FlashInfer and Triton backends, side by side.

Systems: ``flashinfer``, ``triton`` (SGLang's own backends), ``zipkv`` and ``zipkv_uncompressed`` (the same
pool and kernel with compression off). Each runs in its own process (own process group, under ``timeout``:
SGLang's scheduler dies with it and the next system starts on a free GPU). All share the model (Llama-3.1-8B
shape, dummy weights), page size 16, temperature 0, ignore_eos, and the KV budget: max_total_tokens =
46 * 8448 for the uncompressed systems; zipkv gets the same bytes (its pool budget is max_total_tokens x the
uncompressed bytes per token, and it may hold more tokens in them). Milestone ``m2`` (the default): decode
CUDA graphs and the overlap scheduler on, radix cache and chunked prefill off. Milestone ``tp2``: ``m2`` at
tp_size=2 on two GPUs (each rank holds half the KV heads; zipkv's ranks admit on the raw view, see
worker/engines/sglang/allocator.py), e.g. ``--runs zipkv:tp2:online,zipkv_uncompressed:tp2:online,
flashinfer:tp2:online``: greedy identity and the FlashInfer ratio are reported under ``WORKLOAD:tp2``;
``device`` lists every GPU.

Workloads (all requests submitted at once):
- ``offline_8192x256``: 64 requests, 8192 random input ids, 256 new tokens (the ZipFusion setup).
- ``online_1024x8192``: 32 requests, 1024 input ids, 8192 new tokens: pages fill and compress during decode.
  32 requests because each system must finish in ~120 s of one 600 s device call, engine start (35-95 s)
  included: 8192 decode steps at ~8-10 ms take 65-80 s. 32 x 9216 tokens fit every system's budget, so the
  running batch is equal and the throughput ratio isolates the attention kernel over compressed pages.
- ``small_1024x32``: 8 requests, 1024 -> 32 tokens (smoke runs).
- ``online_1024x2048``: online's 32 requests with 2048 new tokens (the TP=2 runs: three fit one call).
- ``prefix_3072x32``: 16 requests sharing a cached 2048-token prefix (milestone 3: radix cache, chunking).
- ``evict_4096x32``: 192 distinct 4096-token prompts, more than the budget holds: the radix cache must evict
  compressed pages to admit the later ones (milestone 3 under memory pressure).

Metrics: defined in ``sglang_e2e_metrics`` (its docstring). Results: ``rows`` (one per system, workload and
milestone) plus ``greedy_tokens_identical`` (zipkv vs zipkv_uncompressed per workload, request by request)
and ``zipkv_over_flashinfer`` (throughput ratios per workload). ``--merge`` adds rows to an existing file.

    python -m bench.serving.bench_sglang_e2e --model DIR --runs zipkv:m2,flashinfer:m2:offline:240
    python -m bench.serving.bench_sglang_e2e --model DIR --runs zipkv:m2:online,flashinfer:m2:online --merge
Run spec: SYSTEM:MILESTONE[:WORKLOAD[:TIMEOUT_S]], WORKLOAD offline (default) | online | small | medium |
prefix | evict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.serving.sglang_e2e_config import (
    BUDGET_TOKENS,
    MILESTONES,
    SYSTEMS,
    WORKLOADS,
    RunSpec,
    engine_kwargs,
    parse_runs,
)
from bench.serving.sglang_e2e_metrics import (
    Stream,
    client_metrics,
    log_metrics,
    print_table,
    request_digest,
    summarize,
)

# The child prints this before its profile pass: the log lines after it are not the timed run's.
PROFILE_MARK = "zipkv-e2e: timed run done; profile pass starts"
ROW_FIELDS = (
    "max_running_requests",
    "decode_tokens_per_s_at_max_batch",
    "decode_tokens_per_s",
    "decode_step_ms",
    "ttft_s_mean",
    "wall_s",
    "compressed_block_fraction",
)


def _prompts(work: Any) -> list[list[int]]:
    """The workload's random input ids (seed 0), its shared prefix (if any) the same in every prompt."""
    import numpy as np

    prompts = np.random.default_rng(0).integers(100, 120000, size=(work.requests, work.input_tokens)).tolist()
    for p in prompts[1:]:
        p[: work.shared_prefix_tokens] = prompts[0][: work.shared_prefix_tokens]
    return prompts


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one system in this process: start SGLang, warm up, time the workload as the client sees it."""
    import sglang

    if args.child.startswith("zipkv"):
        from zipkv.worker.engines.sglang.seams import engine_class

        engine_cls: Any = engine_class()
    else:
        engine_cls = sglang.Engine
    work = WORKLOADS[args.workload]
    kwargs = engine_kwargs(args.child, args.milestone, args.model, args.budget_tokens)
    t0 = time.perf_counter()
    eng = engine_cls(**kwargs)
    start_s = time.perf_counter() - t0
    prompts = _prompts(work)
    shared = work.shared_prefix_tokens
    sp = {"max_new_tokens": work.output_tokens, "temperature": 0.0, "ignore_eos": True}
    eng.generate(input_ids=[p[:256] for p in prompts[:2]], sampling_params={**sp, "max_new_tokens": 8})
    if shared:  # the radix cache holds the shared prefix before the timed requests arrive
        eng.generate(input_ids=[prompts[0][: shared + 16]], sampling_params={**sp, "max_new_tokens": 1})

    async def one(i: int, t_submit: float) -> tuple[Stream, list[int]]:
        arrival, new, seen, last = [], [], 0, None
        stream = await eng.async_generate(input_ids=prompts[i], sampling_params=sp, stream=True)
        async for out in stream:
            # output_ids is SGLang's growing list (not a copy): len() only, so the client stays O(1) a chunk.
            last = out.get("output_ids") or []
            if len(last) > seen:
                arrival.append(time.perf_counter() - t_submit)
                new.append(len(last) - seen)
                seen = len(last)
        return Stream(arrival, new), list(last or [])

    async def run_all() -> list[tuple[Stream, list[int]]]:
        t_submit = time.perf_counter()
        return list(await asyncio.gather(*(one(i, t_submit) for i in range(work.requests))))

    res = eng.loop.run_until_complete(run_all())
    profile = None
    if args.profile_steps:
        print(PROFILE_MARK, flush=True)  # run_one reads the scheduler log only up to here
        profile = _profile(eng, prompts, sp, args)
    eng.shutdown()
    return {
        **({"step_profile": profile} if profile else {}),
        "engine_start_s": round(start_s, 1),
        **client_metrics([s for s, _ in res]),
        "request_sha256": [request_digest(ids) for _, ids in res],
        "first_request_ids": res[0][1][:16],
        "kwargs": {k: v for k, v in kwargs.items() if k != "model_path"},
        "decode_kernel": os.environ.get(
            "ZIPKV_DECODE_KERNEL", "tuned default"
        ),  # kernels/attention/decode_plan.py
        "extend_kernel": os.environ.get("ZIPKV_EXTEND_KERNEL", "restore"),  # kernels/attention/extend.py
        "prefill_kernel": os.environ.get("ZIPKV_PREFILL_KERNEL", "triton"),  # sglang/flashinfer_prefill.py
    }


def _profile(
    eng: Any, prompts: list[list[int]], sp: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """A second pass of the workload, after the timed one, with a few decode steps profiled (step_profile)."""
    from bench.serving.step_profile import profile_decode_steps

    layers = int(json.loads((Path(args.model) / "config.json").read_text())["num_hidden_layers"])
    out_dir = Path(args.json).parent / f"{Path(args.json).stem}_profile"
    try:
        return eng.loop.run_until_complete(
            profile_decode_steps(eng, prompts, sp, out_dir, args.profile_steps, layers)
        )
    except Exception as e:  # the timed run's results stand without the profile
        return {"error": f"{type(e).__name__}: {e}"}


def timed_log_metrics(text: str) -> dict[str, Any]:
    """log_metrics of the timed run: the scheduler log up to the profile pass, if there was one."""
    return log_metrics(text.split(PROFILE_MARK)[0])


def _no_core_files() -> None:
    """A run stopped by SIGABRT leaves no core files (a GPU process's would be gigabytes)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_one(args: argparse.Namespace, spec: RunSpec, left_s: int) -> dict[str, Any]:
    logs = Path(args.logs)
    js, log = logs / f"{spec.name}.json", logs / f"{spec.name}.log"
    timeout_s = min(spec.timeout_s or args.timeout_s, left_s)
    # On the limit, SIGABRT to the run's whole process group (timeout signals its group): with Python's fault
    # handler on in every process of it, the log ends on each one's stacks (a stalled scheduler shows where).
    cmd = ["timeout", "-s", "ABRT", "-k", "15", str(timeout_s)]  # -k: SIGKILL 15 s later if still alive
    cmd += [sys.executable, "-m", "bench.serving.bench_sglang_e2e"]  # this module
    cmd += ["--model", args.model]
    cmd += ["--child", spec.system, "--json", str(js), "--milestone", spec.milestone]
    cmd += ["--workload", next(k for k, w in WORKLOADS.items() if w == spec.workload)]
    cmd += ["--budget-tokens", str(args.budget_tokens), "--profile-steps", str(args.profile_steps)]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        # Own process group: SGLang's scheduler and detokenizer die with it, even on a timeout, so the next
        # system starts on a free GPU.
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=_no_core_files,
        )
        rc = proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(2)
    row: dict[str, Any] = {"system": spec.system, "workload": spec.workload.name, "milestone": spec.milestone}
    row.update(dict.fromkeys(ROW_FIELDS))  # every field the issue names, null when the run gave none
    row.update(rc=rc, timeout_s=timeout_s, process_s=round(time.perf_counter() - t0, 1))
    row.update(json.loads(js.read_text()) if js.exists() else {})
    metrics = timed_log_metrics(log.read_text(errors="replace"))
    if not spec.system.startswith("zipkv") or spec.system == "zipkv_uncompressed":
        metrics = {k: v for k, v in metrics.items() if "compress" not in k and "raw_pages" not in k}
        metrics["compressed_block_fraction"] = None
    row.update(metrics)
    return row


def device_name() -> str:
    q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(q, capture_output=True, text=True, timeout=30, check=True).stdout
        return "; ".join(line.strip() for line in out.splitlines() if line.strip())  # one GPU per line
    return "unknown (nvidia-smi failed)"


def parent(args: argparse.Namespace) -> None:
    runs = parse_runs(args.runs)
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    old = json.loads(out.read_text()) if args.merge and out.exists() else {}
    if args.merge and "rows" not in old:
        print(f"--merge: {out} has no rows (missing or an older format): starting a new file", flush=True)
    results: dict[str, Any] = {
        "device": device_name(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commands": [*old.get("commands", []), args.command or shlex.join(sys.argv)],
        "budget_tokens": args.budget_tokens,
        # Each row keeps the machine it ran on: merged files mix one-GPU and two-GPU (tp2) runs.
        "rows": [{"device": old.get("device"), **r} for r in old.get("rows", [])],
    }
    results["command"] = " ; ".join(results["commands"])  # E1 then E2 when merged
    deadline = time.monotonic() + args.deadline_s
    for spec in runs:
        left = int(deadline - time.monotonic()) - 5
        if left < 30:
            print(f"{spec.name}: skipped, {left}s left", flush=True)
            continue
        row = {"device": results["device"], **run_one(args, spec, left)}
        key = (spec.system, spec.workload.name, spec.milestone)
        results["rows"] = [r for r in results["rows"] if (r["system"], r["workload"], r["milestone"]) != key]
        results["rows"].append(row)
        print(f"{spec.name}: rc={row['rc']} {row['process_s']:.0f}s", flush=True)
        summarize(results)
        out.write_text(json.dumps(results, indent=1))
    summarize(results)
    out.write_text(json.dumps(results, indent=1))
    print_table(results)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="folder with the model's config.json (dummy weights)")
    p.add_argument("--runs", default=",".join(f"{x}:m2" for x in SYSTEMS), help="see the run spec above")
    p.add_argument("--merge", action="store_true", help="keep --out's rows; replace only those rerun")
    p.add_argument("--deadline-s", type=int, default=3600, help="all runs together")
    p.add_argument("--timeout-s", type=int, default=240, help="per run, unless its spec names one")
    p.add_argument("--budget-tokens", type=int, default=BUDGET_TOKENS)
    p.add_argument("--logs", default=os.environ.get("OUT", ".") + "/sglang_e2e_logs")
    p.add_argument("--out", default="bench/results/sglang_e2e.json")
    p.add_argument("--command", help="the command to record (default: this one)")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after each timed run, profile this many decode steps at the largest batch (step_profile.py)",
    )
    p.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--milestone", choices=tuple(MILESTONES), default="m2", help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=tuple(WORKLOADS), default="offline", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        Path(args.json).write_text(json.dumps(child(args), indent=1))
    else:
        parent(args)


if __name__ == "__main__":
    main()

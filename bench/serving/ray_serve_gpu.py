"""The router + one Ray Serve worker replica, started as `zipkv up` starts them, answering OpenAI completions.

Run by bench/run_ray_serve_gpu.sh (on the GPU machine with ``--engine sglang``; on a CPU with
``--engine reference``, which proves the same path with the tiny built-in model). Writes one JSON record:
the responses, the worker report the router saw, and timings (router up, Ray up, replica ready, requests).
This module holds the CLI, the request checks, the record and its summary; the stack itself (start,
readiness wait, stop, the replica's logs) is ``ray_serve_gpu_stack``.

The router tokenizes with the built-in byte tokenizer (ids 0..258). Those ids are valid prompt ids for a
Llama-vocab model too; what such a model generates mostly lies outside the byte range and carries no text
(the byte tokenizer drops ids it cannot render, as it drops BOS/EOS), so with dummy weights the reply text
is mostly empty and `usage.completion_tokens` is what proves the tokens came back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.serving.ray_serve_gpu_stack import ServeStack, replica_info, replica_log_tail
from zipkv.stack.local_http import free_port, http_get
from zipkv.stack.options import StackOptions

PROMPT = "zipkv serves this request through the router and a Ray Serve replica."


def _metrics_for_workers(base_url: str) -> dict[str, float]:
    _, body = http_get(f"{base_url}/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r"(zipkv_router_worker[s_][^ ]*) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _requests(base_url: str, model: str, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=timeout_s)
    extra = {"ignore_eos": True}  # dummy weights may sample EOS at once; a fixed length is what we check
    t0 = time.monotonic()
    done = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0, extra_body=extra
    )
    plain_s = time.monotonic() - t0
    t0 = time.monotonic()
    first_s: float | None = None
    chunks, text, finish, stream_tokens = 0, "", None, None
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    for chunk in stream:
        chunks += 1
        if chunk.choices:
            first_s = first_s if first_s is not None else time.monotonic() - t0
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            stream_tokens = chunk.usage.completion_tokens
    stream_s = time.monotonic() - t0
    usage = done.usage
    return {
        "non_stream": {
            "response": done.model_dump(),
            "latency_ms": plain_s * 1e3,
            "ok": bool(usage and usage.completion_tokens == max_tokens),
        },
        "stream": {
            "chunks": chunks,
            "text": text,
            "finish_reason": finish,
            "first_chunk_ms": None if first_s is None else first_s * 1e3,
            "latency_ms": stream_s * 1e3,
            "completion_tokens": stream_tokens,
            # Chunks carry text only: generated ids outside the byte vocabulary make none (see above).
            "ok": finish == "length" and stream_tokens == max_tokens,
        },
    }


def worker_args_for(args: argparse.Namespace) -> dict[str, Any]:
    worker_args: dict[str, Any] = {"engine": args.engine, "max_running_requests": args.max_running_requests}
    if args.engine == "sglang":
        worker_args.update(gpus_per_replica=1, sglang_args=args.sglang_args)
    return worker_args


def serve_stack(args: argparse.Namespace, worker_args: dict[str, Any]) -> ServeStack:
    options = StackOptions(
        port=free_port(),
        workers=1,
        # Absolute: Ray's worker processes need not share this process's working directory.
        model_path=os.path.abspath(args.model) if args.model else None,
        kv_budget_mib=args.kv_budget_mib,
        compression=args.compression == "true",
        device="cuda" if args.engine == "sglang" else "cpu",
        cpus_per_replica=1,
        ray_num_cpus=args.ray_num_cpus,
        max_context_tokens=args.max_context_tokens,
        metrics_port=free_port(),
    )
    cold = " (SGLang: ~40 s with warm JIT caches, ~190 s more cold)" if args.engine == "sglang" else ""
    return ServeStack(options, worker_args, 1 if args.engine == "sglang" else 0, cold)


def _record_header(args: argparse.Namespace, worker_args: dict[str, Any]) -> dict[str, Any]:
    return {
        "what": "router -> Ray Serve replica -> engine, OpenAI completions (stream and non-stream)",
        "engine": args.engine,
        "model": args.model or "zipkv-tiny (built in)",
        "worker_args": worker_args,
        "kv_budget_mib": args.kv_budget_mib,
        "compression": args.compression == "true",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "python": platform.python_version(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "ok": False,  # set true only once every check below has passed
    }


def _start_and_check(stack: ServeStack, args: argparse.Namespace, record: dict[str, Any]) -> None:
    """Start the stack, send both requests and fill `record` with what the router and the replica saw."""
    t0 = time.monotonic()
    record_versions(record)
    stack.start(ready_timeout_s=args.ready_timeout_s)
    timings = stack.timings_s
    timings["replica_ready"] = time.monotonic() - timings.pop("serve_run_at")
    timings["stack_ready"] = time.monotonic() - t0
    url = stack.base_urls[0]
    record["worker_report_at_ready"] = stack.workers()
    record["requests"] = _requests(url, stack.model_name, args.max_tokens, args.request_timeout_s)
    record["router_readyz"] = json.loads(http_get(f"{url}/readyz")[1])
    record["router_worker_metrics"] = _metrics_for_workers(url)
    record["worker_report_after"] = stack.workers()
    record["replica_info"] = replica_info()
    record["timings_s"] = timings
    r = record["requests"]
    record["ok"] = bool(r["non_stream"]["ok"] and r["stream"]["ok"] and record["router_readyz"]["workers"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    worker_args = worker_args_for(args)
    stack = serve_stack(args, worker_args)
    record = _record_header(args, worker_args)
    try:
        _start_and_check(stack, args, record)
    except BaseException as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["router_log_tail"] = stack.router_log(0)[-3000:]
        record["replica_log_tail"] = replica_log_tail(30)
        print("\n".join(["replica logs (last lines):", *record["replica_log_tail"][-15:]]), flush=True)
        raise
    finally:
        # Written on failure too: the record with its error and log tails is what explains a failed run.
        record.setdefault("timings_s", stack.timings_s)
        Path(args.out).write_text(json.dumps(record, indent=2, default=str))
        print(f"wrote {args.out}", flush=True)
        t_stop = time.monotonic()
        stack.stop()
        print(f"stack stopped in {time.monotonic() - t_stop:.1f} s", flush=True)
    return record


def record_versions(record: dict[str, Any]) -> None:
    import importlib.metadata as md

    versions: dict[str, str | None] = {}
    for dist in ("ray", "torch", "sglang", "grpcio", "protobuf", "fastapi", "openai"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    record["versions"] = versions
    try:
        import torch

        record["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        record["device"] = "unknown (no torch)"


def _summary(record: dict[str, Any]) -> None:
    t = record.get("timings_s", {})
    r = record.get("requests", {})
    ns, st = r.get("non_stream", {}), r.get("stream", {})
    usage = (ns.get("response") or {}).get("usage") or {}
    rows = [
        ("engine / device", f"{record['engine']} / {record.get('device')}"),
        ("ray start", f"{t.get('ray_start', float('nan')):.1f} s"),
        ("replica ready (serve.run -> first report)", f"{t.get('replica_ready', float('nan')):.1f} s"),
        ("stack ready (total)", f"{t.get('stack_ready', float('nan')):.1f} s"),
        ("non-stream completion", f"{ns.get('latency_ms', float('nan')):.0f} ms, usage {usage}"),
        ("stream completion", f"{st.get('latency_ms', float('nan')):.0f} ms, {st.get('chunks')} chunks, "
         f"{st.get('completion_tokens')} tokens, first chunk after "
         f"{st.get('first_chunk_ms') or float('nan'):.0f} ms, finish {st.get('finish_reason')}"),
        ("router sees workers", str((record.get("router_readyz") or {}).get("workers"))),
        ("ok", str(record["ok"])),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def add_stack_args(p: argparse.ArgumentParser, ready_timeout_s: float) -> None:
    """The stack's options (engine, model, KV budget, replica limits), shared with the replica fault drill."""
    p.add_argument("--engine", choices=["sglang", "reference"], default="sglang")
    p.add_argument("--model", default="", help="model folder (config.json); empty = the built-in tiny model")
    p.add_argument("--kv-budget-mib", type=float, default=512.0, help="KV budget of the replica (MiB)")
    p.add_argument("--max-running-requests", type=int, default=4)
    p.add_argument(
        "--compression", choices=["true", "false"], default="true", help="false: the uncompressed twin"
    )
    p.add_argument("--sglang-args", default="", help="JSON object of extra sglang.Engine arguments")
    p.add_argument("--max-context-tokens", type=int, default=2048)
    p.add_argument("--ray-num-cpus", type=int, default=4)
    p.add_argument("--ready-timeout-s", type=float, default=ready_timeout_s)


def run_or_report(
    run: Callable[[argparse.Namespace], dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any] | None:
    """`run(args)`'s record, or None once its failure is printed (the record on disk has its details)."""
    try:
        return run(args)
    except BaseException as exc:
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_stack_args(p, ready_timeout_s=240.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--request-timeout-s", type=float, default=60.0)
    p.add_argument("--out", required=True, help="JSON record to write")
    args = p.parse_args(argv)
    record = run_or_report(run, args)
    if record is None:
        return 1
    _summary(record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

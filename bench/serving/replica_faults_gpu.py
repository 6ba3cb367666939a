"""The replica fault drill's runner: start the stack, inject each fault with long requests in flight, wait for
the replacement, probe it, write one JSON record (what each client saw, the recovery timings, GPU memory).
Its pieces (requests in flight, outcome classes, the replacement wait): bench/serving/replica_faults.py.

    python -m bench.serving.replica_faults_gpu --engine sglang --model .carry/llama31_8b --faults kill,hang \
        --out $OUT/replica_faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.serving.ray_serve_gpu import (
    add_stack_args,
    record_versions,
    run_or_report,
    serve_stack,
    worker_args_for,
)
from bench.serving.ray_serve_gpu_stack import ServeStack, replica_info, replica_log_tail
from bench.serving.replica_faults import (
    InFlight,
    child_pids,
    classify,
    gpu_memory_mib,
    probe,
    wait_replacement,
)


def _signal_fault(fault: str, pid: int) -> dict[str, Any]:
    """kill: SIGKILL the replica's process; hang: SIGSTOP its children (the engine's processes), leaving the
    replica process, its gRPC server and its Serve health check running."""
    if fault == "kill":
        os.kill(pid, signal.SIGKILL)
        return {"signalled": [pid], "signal": "SIGKILL"}
    children = child_pids(pid)
    if not children:
        raise RuntimeError(f"the replica (pid {pid}) has no child processes to stop: hang needs SGLang's")
    for child in children:
        os.kill(child, signal.SIGSTOP)
    return {"signalled": children, "signal": "SIGSTOP"}


def run_fault(stack: ServeStack, fault: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fault with a streamed and a non-streamed request in flight; the record of what followed."""
    url, model = stack.base_urls[0], stack.model_name
    info = replica_info()
    load = InFlight(url, model, args.max_tokens, args.request_timeout_s).start()
    time.sleep(args.fault_after_s)
    running = _wait_both_running(stack, args.in_flight_timeout_s)
    fault_s = time.time()
    signalled = _signal_fault(fault, int(info["pid"]))
    print(
        f"[replica_faults] {fault}: {signalled} with {running} running; waiting for a replacement", flush=True
    )
    recovery = wait_replacement(stack, info["worker_id"], fault_s, args.recover_timeout_s)
    outcomes = load.join()
    for name, out in outcomes.items():
        out["class"] = classify(out, args.max_tokens, streamed=name == "stream")
        if out.get("ended_s") is not None:
            out["ended_after_fault_s"] = round(out.pop("ended_s") - fault_s, 2)
    after = probe(url, model, args.request_timeout_s) if recovery["replacement"] else {"ok": False}
    both_in_flight = sum(running) >= 2
    return {
        "fault": fault, "killed_worker": info["worker_id"], "pid": info["pid"], **signalled,
        "running_requests_at_fault": running, "fault_after_request_s": round(fault_s - load.started_s, 2),
        "requests": outcomes, "recovery": recovery, "probe_after": after,
        "both_in_flight": both_in_flight,
        # Passed: both requests were generating when the fault came, no client hung or got a short reply
        # passed off as whole, and a replacement serves.
        "ok": bool(after["ok"]) and both_in_flight
        and all(o["class"] in ("whole", "clean_error") for o in outcomes.values()),
    }  # fmt: skip


def _wait_both_running(stack: ServeStack, timeout_s: float) -> list[int]:
    """Each worker's running requests once both of the drill's are generating, or at ``timeout_s`` (then
    the fault still comes, and the record says so: a KV budget that holds only one request of prompt +
    max_tokens leaves the other waiting at the router, which tests less than the drill means to)."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [w.get("running_requests", 0) for w in stack.workers()]
        if sum(running) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if sum(running) < 2:
        print(
            f"[replica_faults] only {sum(running)} of the 2 requests running after {timeout_s:.0f} s: the KV "
            "budget holds fewer requests of prompt + max_tokens; raise --kv-budget-mib (KV_BUDGET_MIB) or "
            "lower --max-tokens. Faulting anyway.",
            flush=True,
        )
    return running


def run(args: argparse.Namespace) -> dict[str, Any]:
    worker_args = {**worker_args_for(args), "engine_stall_s": args.engine_stall_s}
    stack = serve_stack(args, worker_args)
    record: dict[str, Any] = {
        "what": "worker replica faults mid-generation on router -> Ray Serve replica -> engine (one replica)",
        "engine": args.engine, "model": args.model or "zipkv-tiny (built in)", "worker_args": worker_args,
        "max_tokens": args.max_tokens, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "faults": [], "ok": False,
    }  # fmt: skip
    try:
        record_versions(record)
        t0 = time.monotonic()
        stack.start(ready_timeout_s=args.ready_timeout_s)
        record["stack_ready_s"] = round(time.monotonic() - t0, 1)
        record["gpu_memory_mib_ready"] = gpu_memory_mib()
        record["probe_before"] = probe(stack.base_urls[0], stack.model_name, args.request_timeout_s)
        for fault in args.faults.split(","):
            record["faults"].append(run_fault(stack, fault, args))
            _say(record["faults"][-1])
        record["ok"] = record["probe_before"]["ok"] and all(f["ok"] for f in record["faults"])
    except BaseException as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["router_log_tail"] = stack.router_log(0)[-3000:]
        record["replica_log_tail"] = replica_log_tail(30)
        raise
    finally:
        Path(args.out).write_text(json.dumps(record, indent=2, default=str))
        print(f"wrote {args.out}", flush=True)
        stack.stop()
    return record


def _say(f: dict[str, Any]) -> None:
    r, rec = f["requests"], f["recovery"]
    print(
        f"[replica_faults] {f['fault']}: stream {r['stream']['class']} after "
        f"{r['stream'].get('ended_after_fault_s')} s, non-stream {r['non_stream']['class']} after "
        f"{r['non_stream'].get('ended_after_fault_s')} s; dead worker gone {rec['dead_worker_gone_s']} s, "
        f"replacement reporting {rec['replacement_report_s']} s; probe {f['probe_after']}; ok {f['ok']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_stack_args(p, ready_timeout_s=300.0)
    p.add_argument("--faults", default="kill,hang", help="comma-separated, in order: kill, hang")
    p.add_argument("--max-tokens", type=int, default=1900, help="per request: outlasts the fault")
    p.add_argument("--fault-after-s", type=float, default=3.0, help="from the requests' start to the fault")
    p.add_argument("--in-flight-timeout-s", type=float, default=30.0, help="then the most to wait for both")
    p.add_argument("--engine-stall-s", type=float, default=20.0, help="the replica's stall watchdog")
    p.add_argument("--recover-timeout-s", type=float, default=240.0)
    p.add_argument("--request-timeout-s", type=float, default=120.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    record = run_or_report(run, args)
    if record is None:
        return 1
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

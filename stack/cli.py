"""The `zipkv` command: `zipkv up` runs the local stack, `zipkv status` shows its workers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the commands import the stack when they run, so `zipkv --help` loads none of it
    from zipkv.stack.local_stack import LocalStack
    from zipkv.stack.options import StackOptions


def _up(args: argparse.Namespace) -> int:
    from zipkv.stack.local_stack import LocalStack

    try:
        options = _stack_options(args)
    except ValueError as exc:
        print(f"zipkv up: {exc}", file=sys.stderr)
        return 2
    stack = LocalStack(options, progress=lambda line: print(line, flush=True))
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        stack.start()
    except Exception as exc:
        print(f"zipkv up: failed to start: {exc}", file=sys.stderr)
        stack.stop()
        return 1
    # ray.init installs its own SIGTERM handler (exit at once); ours drains first.
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if stop.is_set():
        stack.stop()
        return 130
    _print_ready(stack)
    _supervise_until(stop, stack)
    print("\nstopping (draining workers; a second Ctrl-C is ignored until done)", flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stack.stop()
    return 0


def _stack_options(args: argparse.Namespace) -> StackOptions:
    """`zipkv up`'s flags as the stack's options (ValueError saying which flag is wrong)."""
    from zipkv.stack.options import StackOptions

    return StackOptions(
        port=args.port,
        workers=args.workers,
        routers=args.routers,
        redis_url=args.redis,
        model_path=args.model,
        model_name=args.model_name,
        kv_budget_mib=args.kv_budget_mib,
        compression=not args.no_compression,
        device=args.device,
        max_context_tokens=args.max_context_tokens,
        chat_template=args.chat_template,
        otlp_endpoint=args.otlp,
        metrics_port=args.metrics_port,
    )


def _print_ready(stack: LocalStack) -> None:
    """Where the API is, a request to try, and where to look."""
    from zipkv.stack.local_observability import where_to_look

    url, options = stack.base_urls[0], stack.options
    print(
        f"\nzipkv is ready: {options.workers} worker(s), model {stack.model_name!r}, "
        f"OpenAI API at {url}/v1\n"
        f"  try:  curl -s {url}/v1/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{stack.model_name}", "prompt": "hello", "max_tokens": 16}}\'\n'
        f"  or:   zipkv status --port {options.port}\n"
        "Where to look:\n" + "\n".join(where_to_look(stack)) + "\n"
        "Press Ctrl-C to stop.",
        flush=True,
    )


def _supervise_until(stop: threading.Event, stack: LocalStack) -> None:
    """Until ``stop`` is set: a lost router is restarted while the others keep serving; one that keeps
    crashing stops the stack."""
    while not stop.wait(0.5):
        try:
            stack.supervise_routers()
        except RuntimeError as exc:
            print(f"zipkv up: {exc}; stopping", file=sys.stderr)
            stop.set()


def _fmt_tokens(n: float) -> str:
    return f"{n / 1000:.1f}k" if abs(n) >= 10_000 else f"{int(n)}"


def status_rows(workers: list[dict[str, Any]], now_s: float) -> list[list[str]]:
    rows = []
    for w in workers:
        total = int(w.get("total_tokens", 0)) or 1
        headroom = int(w.get("headroom_tokens", 0))
        age = now_s - float(w.get("received_s", 0))
        state = "draining" if w.get("draining") else ("stale" if age > 2 else "ok")
        rows.append(
            [
                w["worker_id"],
                w.get("address", ""),
                state,
                f"{_fmt_tokens(headroom)} ({100 * headroom / total:.0f}%)",
                f"{float(w.get('compression_ratio', 1.0)):.3f}",
                f"{w.get('running_requests', 0)} run / {w.get('queued_requests', 0)} queued",
                f"{float(w.get('itl_ms', 0)):.1f}",
                f"{age * 1000:.0f} ms",
            ]
        )
    return rows


def _status(args: argparse.Namespace) -> int:
    from zipkv.stack.local_http import http_get
    from zipkv.stack.local_stack import STATE_DIR

    path = Path(STATE_DIR) / f"status-{args.port}.json"
    url = f"http://127.0.0.1:{args.port}"
    try:
        router_ok = http_get(f"{url}/healthz", 1.0)[0] == 200
    except OSError:
        router_ok = False
    if not path.exists():
        print(f"no local zipkv stack on port {args.port} ({path} not found): start one with `zipkv up`")
        return 1
    data = json.loads(path.read_text())
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    now = time.time()
    print(
        f"router {url}: {'up' if router_ok else 'NOT ANSWERING'}; "
        f"status written {now - data['written_s']:.1f} s ago"
    )
    head = ["worker", "address", "state", "headroom tokens", "ratio", "load", "itl ms", "report age"]
    rows = [head, *status_rows(data["workers"], now)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if not data["workers"]:
        print("(no worker has reported yet)")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zipkv", description="zipkv: LLM serving with a lossless compressed KV cache"
    )
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run a local stack: router (HTTP on localhost) + Ray Serve workers")
    up.add_argument("--port", type=int, default=8000, help="router HTTP port (router k uses PORT+k)")
    up.add_argument("--workers", type=int, default=2, help="worker replicas (default 2)")
    up.add_argument(
        "--model",
        default=None,
        help="local Hugging Face checkpoint folder, a GGUF file or a folder holding one (default: tiny)",
    )
    up.add_argument(
        "--model-name", default=None, help="name clients use (default: folder name or zipkv-tiny)"
    )
    up.add_argument(
        "--kv-budget-mib", type=float, default=64.0, help="KV memory per worker, MiB (default 64)"
    )
    up.add_argument(
        "--no-compression", action="store_true", help="store the KV cache uncompressed (comparison)"
    )
    up.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="context per request (default: the model's max_position_embeddings; must fit the KV budget)",
    )
    up.add_argument(
        "--chat-template",
        default="",
        metavar="NAME|FILE",
        help="chat template: one of the model's named templates, or a .jinja file (default: the model's)",
    )
    up.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    up.add_argument(
        "--redis", default=None, metavar="URL", help="shared router state in Redis (redis://host:6379/0)"
    )
    up.add_argument("--routers", type=int, default=1, help="router processes (>1 needs --redis)")
    up.add_argument(
        "--otlp",
        default=None,
        metavar="URL",
        help="export the router's and workers' spans to this OTLP/gRPC collector (http://HOST:4317); "
        "the standard OTEL_* variables work too",
    )
    up.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        help="workers serve Prometheus /metrics on the first free ports from here (default 9400; -1: off)",
    )
    st = sub.add_parser("status", help="show the local stack's workers: headroom, compression ratio, load")
    st.add_argument("--port", type=int, default=8000)
    st.add_argument("--json", action="store_true", help="print the raw reports as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    # gRPC's fork warnings (Ray forks while our status tap serves) are noise for a user.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    return _status(args)


if __name__ == "__main__":
    sys.exit(main())

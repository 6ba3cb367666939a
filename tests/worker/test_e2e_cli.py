"""The README's first command: `zipkv up` starts the local stack with progress, answers, stops on Ctrl-C;
it says where the logs, metrics and traces are, and `--otlp URL` sends one trace per request, router and
Ray Serve replica together, to an OTLP/gRPC collector (one runs in this process)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.serving.trace_capture import OtlpReceiver
from zipkv.stack.local_http import free_port, http_get

pytestmark = pytest.mark.slow


def test_zipkv_up_answers_and_stops_cleanly_on_ctrl_c() -> None:
    cmd = zipkv_command()
    port, metrics_port = free_port(), free_port()
    receiver = OtlpReceiver().start()
    proc = start_stack(cmd, port, metrics_port, receiver.endpoint)
    lines: list[str] = []
    done: dict[str, object] = {}
    streamer: threading.Thread | None = None
    try:
        log = read_until_ready(proc, lines)
        worker_metrics = where_to_look(log, port, receiver.endpoint)
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = api.completions.create(model="zipkv-tiny", prompt="hello", max_tokens=16)
        assert reply.usage is not None and reply.usage.completion_tokens == 16
        check_one_trace(receiver, output_tokens=16)
        for url in worker_metrics:
            code, body = http_get(url)
            assert (
                code == 200
                and b"zipkv_worker_kv_stored_bytes{" in body
                and b"zipkv_worker_kernel_info{" in body
            )
        status = subprocess.run(
            [*cmd, "status", "--port", str(port)], capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0 and status.stdout.count(" ok ") == 2, status.stdout + status.stderr
        # Ctrl-C while a request streams: the workers drain, so it still completes.
        streamer = stream_in_background(api, done)
    finally:
        receiver.stop()
        lines.append(interrupt(proc))
    log = "".join(lines)
    assert streamer is not None
    streamer.join(60)
    assert done.get("reasons") == ["length"], done  # all 600 tokens, though Ctrl-C came after the first
    print(f"streamed {done['pieces']} chunks across the Ctrl-C")
    assert proc.returncode == 0, log
    assert "draining workers" in log and "stopped" in log, log
    assert "Traceback" not in log, log
    with pytest.raises(OSError):  # the router is gone too
        http_get(f"http://127.0.0.1:{port}/healthz", 1.0)


def zipkv_command() -> list[str]:
    """The console script of the interpreter running the tests (another `zipkv` on PATH may be another
    checkout's), else the module."""
    beside = Path(sys.executable).parent / "zipkv"
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "zipkv.stack.cli"]


def start_stack(cmd: list[str], port: int, metrics_port: int, otlp: str) -> subprocess.Popen[str]:
    args = ["up", "--port", str(port), "--workers", "2", "--kv-budget-mib", "16"]
    args += ["--otlp", otlp, "--metrics-port", str(metrics_port)]
    return subprocess.Popen(
        [*cmd, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # the standard variable, passed on to the router and the replicas: export spans every 200 ms
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_BSP_SCHEDULE_DELAY": "200"},
    )


def read_until_ready(proc: subprocess.Popen[str], lines: list[str]) -> str:
    """Reads `zipkv up`'s output into `lines` until it says it is ready; checks it showed progress."""
    started = time.monotonic()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl-C" in line or proc.poll() is not None:
            break
        assert time.monotonic() - started < 240, "".join(lines)
    log = "".join(lines)
    assert "zipkv is ready" in log, log
    for step in ("starting router", "router up", "starting Ray", "worker replica", "2/2 workers reporting"):
        assert step in log, log
    print(f"zipkv up ready in {time.monotonic() - started:.1f} s")
    return log


def stream_in_background(api: openai.OpenAI, done: dict[str, object]) -> threading.Thread:
    """Streams 600 tokens on a thread into `done` (finish reasons, chunk count, or the error); returns
    once the first chunk has arrived."""
    first = threading.Event()

    def stream() -> None:
        try:
            chunks = api.completions.create(
                model="zipkv-tiny",
                prompt="drain",
                max_tokens=600,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            reasons: list[str] = []
            pieces = 0
            for chunk in chunks:
                first.set()
                pieces += 1
                reasons.extend(c.finish_reason for c in chunk.choices if c.finish_reason)
            done["reasons"], done["pieces"] = reasons, pieces
        except BaseException as exc:
            done["error"] = exc
        first.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first.wait(30)
    return streamer


def interrupt(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C, then the rest of the output once it has stopped (killed after 90 s)."""
    proc.send_signal(signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
    return rest or ""


def where_to_look(log: str, port: int, otlp: str) -> list[str]:
    """The ready message names the router log, the metrics of the router and of both workers, and where
    traces go; returns the workers' metrics URLs."""
    assert "Where to look:" in log, log
    assert re.search(r"logs +routers \(JSON lines\): \S+/router-0\.log", log), log
    assert f"routers: http://127.0.0.1:{port}/metrics" in log, log
    workers = re.search(r"^ +workers: (http://\S+/metrics), (http://\S+/metrics)$", log, re.MULTILINE)
    assert workers, log
    assert f"traces   OTLP/gRPC to {otlp}" in log, log
    return [workers.group(1), workers.group(2)]


def check_one_trace(receiver: OtlpReceiver, output_tokens: int) -> None:
    """The request's spans reach the collector from the router process and the Ray Serve replica, in one
    trace, the replica's Generate span a child of the router's dispatch span."""
    deadline = time.monotonic() + 30
    while True:
        spans: list[dict[str, Any]] = list(receiver.spans)
        roots = [s for s in spans if s["name"] == "text_completion zipkv-tiny"]
        generates = [s for s in spans if s["name"] == "zipkv.generate"]
        if roots and generates and any(s["name"] == "zipkv.decode" for s in spans):
            break
        assert time.monotonic() < deadline, f"spans so far: {[(s['service'], s['name']) for s in spans]}"
        time.sleep(0.2)
    (root,) = roots
    trace = [s for s in spans if s["trace_id"] == root["trace_id"]]
    by_id = {s["span_id"]: s for s in trace}
    (generate,) = [s for s in trace if s["name"] == "zipkv.generate"]
    assert generate["service"] == "zipkv-worker" and root["service"] == "zipkv-router"
    assert by_id[generate["parent_span_id"]]["name"] == "zipkv.dispatch"
    assert generate["attributes"]["gen_ai.usage.output_tokens"] == output_tokens
    assert generate["attributes"]["zipkv.worker.id"].startswith("zipkv-worker-")  # the Serve replica
    phases = {s["name"] for s in trace if s["parent_span_id"] == generate["span_id"]}
    assert phases == {"zipkv.queue", "zipkv.admission", "zipkv.prefill", "zipkv.decode"}

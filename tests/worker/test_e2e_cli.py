"""The README's first command: `zipkv up` starts the local stack with progress, answers, stops on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

from zipkv.worker.local_stack import free_port, http_get

pytestmark = pytest.mark.slow


def test_zipkv_up_answers_and_stops_cleanly_on_ctrl_c() -> None:
    exe = shutil.which("zipkv")
    cmd = [exe] if exe else [sys.executable, "-m", "zipkv.worker.cli"]
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "up", "--port", str(port), "--workers", "2", "--kv-budget-mib", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "zipkv is ready" in line or proc.poll() is not None:
                break
            assert time.monotonic() - started < 240, "".join(lines)
        ready_s = time.monotonic() - started
        log = "".join(lines)
        assert "zipkv is ready" in log, log
        # Progress was shown while it started.
        for step in (
            "starting router",
            "router up",
            "starting Ray",
            "worker replica",
            "2/2 workers reporting",
        ):
            assert step in log, log
        print(f"zipkv up ready in {ready_s:.1f} s")
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = api.completions.create(model="zipkv-tiny", prompt="hello", max_tokens=16)
        assert reply.usage is not None and reply.usage.completion_tokens == 16
        status = subprocess.run(
            [*cmd, "status", "--port", str(port)], capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0 and status.stdout.count(" ok ") == 2, status.stdout + status.stderr
        # Ctrl-C while a request streams: the workers drain, so it still completes.
        done: dict[str, object] = {}
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
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        lines.append(rest or "")
    log = "".join(lines)
    streamer.join(60)
    assert done.get("reasons") == ["length"], done  # all 600 tokens, though Ctrl-C came after the first
    print(f"streamed {done['pieces']} chunks across the Ctrl-C")
    assert proc.returncode == 0, log
    assert "draining workers" in log and "stopped" in log, log
    assert "Traceback" not in log, log
    with pytest.raises(OSError):  # the router is gone too
        http_get(f"http://127.0.0.1:{port}/healthz", 1.0)

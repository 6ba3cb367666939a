"""SGLang's server and gateway as processes, for bench/serving/serving_systems.py: their command lines, each
server's environment, and the process handling (spawn, wait until it answers HTTP, stop).

Kept apart from the systems themselves (serving_systems.py: which processes make which system, what its
record says) because this side is the one tied to SGLang 0.5.17's server flags and sglang-router 0.3.2's,
and the one tests/bench/test_serving_harness.py and test_gateway_probe.py check against those versions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zipkv.stack.local_http import http_get

MODEL_NAME = "llama"  # the name every system serves the model under (the client asks for it)


def sglang_server_cmd(opts: dict[str, Any], port: int) -> list[str]:
    """SGLang's server with the flags zipkv's replica gets (bench/run_serving_gpu.sh's SGLANG_ARGS)."""
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        opts["model"],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL_NAME,
        "--tokenizer-path",
        opts["tokenizer"],
        "--attention-backend",
        "flashinfer",
        "--page-size",
        "16",
        "--dtype",
        "bfloat16",
        "--max-total-tokens",
        str(opts["budget_tokens"]),
        "--max-running-requests",
        str(opts["max_running"]),
    ]
    for key, value in opts["sglang_args"].items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not False:
            cmd += [flag, str(value)]
    return cmd


def server_envs(replicas: int, base: dict[str, str], gpus: int | None = None) -> list[dict[str, str]]:
    """The environment of SGLang's server k of `replicas`: device k only, so each owns one GPU; with
    fewer `gpus`, device k mod gpus (the servers share them, as a one-GPU dry run needs)."""
    n = replicas if gpus is None else gpus
    return [{**base, "CUDA_VISIBLE_DEVICES": str(k % n)} for k in range(replicas)]


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the server and its children
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    return stop


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str, log: Path) -> None:
    t0 = last = time.monotonic()
    while True:
        try:
            if http_get(url, 2.0)[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited ({proc.returncode}); its log {log}:\n{log.read_text()[-3000:]}"
            )
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise TimeoutError(f"{what} did not answer {url} within {timeout_s:.0f} s; its log: {log}")
        if now - last > 15:
            last = now
            # Under serving_systems' prefix, as its stop failures: the lines of a system's start and stop.
            print(f"[serving_systems] waiting for {what} ({now - t0:.0f} s)", flush=True)
        time.sleep(0.5)

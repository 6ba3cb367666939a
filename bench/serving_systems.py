"""Start and stop the systems the serving sweep compares, each behind an OpenAI /v1/completions endpoint.

    zipkv               zipkv's router + one Ray Serve replica running SGLang with zipkv (`zipkv up`'s stack,
                        bench/ray_serve_gpu_stack.py), the id tokenizer at the router
    zipkv_uncompressed  the same with compression off (zipkv's pool and kernel, no page compressed)
    sglang_gateway      SGLang's own server (`python -m sglang.launch_server`, FlashInfer), measured
                        directly: with one worker SGLang's gateway only proxies, and sglang-router 0.3.2
                        refuses token-id prompts on its OpenAI endpoint (422: "prompt: data did not match
                        any variant of untagged enum StringOrArray", seen on a CPU in front of a zipkv
                        router), so the token-id trace cannot go through it; its routing policies are
                        compared in the cluster simulation
With `engine=reference` (a CPU, the tiny built-in model) the zipkv systems run as `zipkv up` runs them;
SGLang's server needs a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_serve_gpu_stack import ServeStack

from zipkv.stack.local_stack import StackOptions, free_port, http_get

MODEL_NAME = "llama"


@dataclass
class Running:
    base_url: str
    model: str
    note: str
    stop_fns: list[Any] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        for fn in reversed(self.stop_fns):
            try:
                fn()
            except Exception as exc:  # stopping must go on; say what failed
                print(f"[serving_systems] stop step failed: {exc}", flush=True)


class _IdTokenizerStack(ServeStack):
    """`zipkv up`'s stack with the router tokenizing through the id tokenizer."""

    def __init__(self, tokenizer: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer = tokenizer

    def _router_config(self, k: int) -> Path:
        path = super()._router_config(k)
        config = json.loads(path.read_text())
        config["models"][0]["tokenizer"] = self.tokenizer
        path.write_text(json.dumps(config, indent=2))
        return path


def start_zipkv(opts: dict[str, Any], compression: bool) -> Running:
    sglang = opts["engine"] == "sglang"
    options = StackOptions(
        port=free_port(),
        workers=1,
        model_path=os.path.abspath(opts["model"]) if opts["model"] else None,
        model_name=MODEL_NAME if opts["model"] else None,
        kv_budget_mib=opts["kv_budget_mib"],
        compression=compression,
        device="cuda" if sglang else "cpu",
        cpus_per_replica=1,
        ray_num_cpus=4,
        max_context_tokens=opts["max_context_tokens"],
    )
    worker_args: dict[str, Any] = {"engine": opts["engine"], "max_running_requests": opts["max_running"]}
    if sglang:
        worker_args.update(gpus_per_replica=1, sglang_args=json.dumps(opts["sglang_args"]))
    stack = _IdTokenizerStack(opts["tokenizer"], options, worker_args, 1 if sglang else 0)
    t0 = time.monotonic()
    stack.start(ready_timeout_s=opts["ready_s"])
    note = f"zipkv router + 1 Ray Serve replica (engine {opts['engine']}, compression {compression})"
    run = Running(stack.base_urls[0], stack.model_name, note, [stack.stop])
    run.timings_s["ready"] = round(time.monotonic() - t0, 1)
    return run


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stopper(proc: subprocess.Popen[bytes]) -> Any:
    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the server and its children
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    return stop


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str, log: Path) -> None:
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
            print(f"[serving_systems] waiting for {what} ({now - t0:.0f} s)", flush=True)
        time.sleep(0.5)


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


def start_sglang_server(opts: dict[str, Any], out: Path) -> Running:
    if opts["engine"] != "sglang":
        raise SystemExit("sglang_gateway runs SGLang's server, which needs a GPU: use --engine sglang there")
    t0 = time.monotonic()
    port = free_port()
    log = out / "sglang_server.log"
    server = _spawn(sglang_server_cmd(opts, port), log)
    note = "sglang.launch_server (FlashInfer), directly: one worker, no gateway"
    run = Running(f"http://127.0.0.1:{port}", MODEL_NAME, note, [_stopper(server)])
    _wait_http(f"{run.base_url}/v1/models", server, opts["ready_s"], "SGLang's server", log)
    run.timings_s["ready"] = round(time.monotonic() - t0, 1)
    return run


def start(system: str, opts: dict[str, Any], out: Path) -> Running:
    if system == "zipkv":
        return start_zipkv(opts, compression=True)
    if system == "zipkv_uncompressed":
        return start_zipkv(opts, compression=False)
    if system == "sglang_gateway":
        return start_sglang_server(opts, out)
    raise ValueError(f"unknown system {system!r}: zipkv | zipkv_uncompressed | sglang_gateway")

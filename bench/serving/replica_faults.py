"""Worker replica faults on the live stack (router -> Ray Serve replica -> engine), long requests in flight:

    kill   the replica's process SIGKILLed mid-generation (a crash, an OOM kill)
    hang   the engine's child processes SIGSTOPped (SGLang's scheduler hung: the replica process itself, its
           gRPC server and its health check still answer); the stall watchdog (`engine_stall_s`) must fail
           the calls held and the health check, so that the clients are told and Serve replaces the replica

One replica, so a lost worker's requests have nowhere else to go: what is measured is what each client saw
(a clean error, never a hang or a truncated reply passed off as whole) and how long until a replacement
replica serves, which on a GPU includes its model load and CUDA graph capture. Run by
`DRILL=replica_faults bash bench/run_ray_serve_gpu.sh` (SGLang on the GPU machine; `python -m
bench.serving.replica_faults_gpu --engine reference --faults kill` runs the kill on a CPU).
The stack, its start and the JSON record's header are bench/serving/ray_serve_gpu.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.serving.ray_serve_gpu_stack import ServeStack

PROMPT = "zipkv keeps generating while the fault drill breaks the replica under it."


class InFlight:
    """One streamed and one non-streamed completion on threads, each outcome stamped with wall-clock times
    (time.time(), to compare with the fault's)."""

    def __init__(self, url: str, model: str, max_tokens: int, timeout_s: float) -> None:
        self.body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                     "ignore_eos": True}  # fmt: skip
        self.url, self.timeout_s = url, timeout_s
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.threads = [threading.Thread(target=self._stream, daemon=True),
                        threading.Thread(target=self._plain, daemon=True)]  # fmt: skip

    def start(self) -> InFlight:
        self.started_s = time.time()
        for t in self.threads:
            t.start()
        return self

    def join(self) -> dict[str, dict[str, Any]]:
        for t in self.threads:
            t.join(self.timeout_s + 10)
        return self.outcomes

    def _plain(self) -> None:
        out: dict[str, Any] = {"ended_s": None}
        try:
            r = httpx.post(f"{self.url}/v1/completions", json=self.body, timeout=self.timeout_s)
            out.update(status=r.status_code, body=r.text[:400])
            if r.status_code == 200:
                out["completion_tokens"] = r.json()["usage"]["completion_tokens"]
        except httpx.HTTPError as exc:
            out["transport_error"] = f"{type(exc).__name__}: {exc}"
        out["ended_s"] = time.time()
        self.outcomes["non_stream"] = out

    def _stream(self) -> None:
        body = {**self.body, "stream": True, "stream_options": {"include_usage": True}}
        out: dict[str, Any] = {"events": 0, "error_event": None, "finish_reason": None, "usage_tokens": None,
                               "done_marker": False}  # fmt: skip
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=self.timeout_s) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    _read_event(line, out)
        except httpx.HTTPError as exc:
            out["transport_error"] = f"{type(exc).__name__}: {exc}"
        out["ended_s"] = time.time()
        self.outcomes["stream"] = out


def _read_event(line: str, out: dict[str, Any]) -> None:
    if not line.startswith("data: "):
        return
    if line == "data: [DONE]":
        out["done_marker"] = True
        return
    out["events"] += 1
    event = json.loads(line[len("data: ") :])
    if "error" in event:
        out["error_event"] = event["error"]
    for choice in event.get("choices") or []:
        out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
    if event.get("usage"):
        out["usage_tokens"] = event["usage"]["completion_tokens"]


def classify(outcome: dict[str, Any], max_tokens: int, streamed: bool) -> str:
    """whole: the full reply; clean_error: an HTTP error status or an error event, so the client knows;
    hung: no answer within the timeout; truncated: a reply that ends short without saying so."""
    if outcome.get("transport_error"):
        return "hung" if "Timeout" in outcome["transport_error"] else "transport_error"
    if outcome.get("status") != 200:
        return "clean_error"
    if not streamed:
        return "whole" if outcome.get("completion_tokens") == max_tokens else "truncated"
    if outcome.get("error_event") is not None:
        return "clean_error"
    whole = outcome.get("finish_reason") == "length" and outcome.get("usage_tokens") == max_tokens
    return "whole" if whole and outcome.get("done_marker") else "truncated"


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (SGLang's scheduler and detokenizer under a replica), by /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after the parenthesised name
                children.append(int(entry))
    return children


def gpu_memory_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        return int(out.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_replacement(stack: ServeStack, dead_id: str, fault_s: float, timeout_s: float) -> dict[str, Any]:
    """Seconds from the fault until the dead worker's reports stopped and a new worker id first reported,
    with the GPU's memory sampled every second meanwhile (the dead replica's freed, the new one's loaded)."""
    out: dict[str, Any] = {"dead_worker_gone_s": None, "replacement": None, "replacement_report_s": None,
                           "gpu_memory_mib": []}  # fmt: skip
    last_sample = 0.0
    while time.time() - fault_s < timeout_s and out["replacement"] is None:
        now = time.time()
        ids = {w["worker_id"] for w in stack.workers()}
        if dead_id not in ids and out["dead_worker_gone_s"] is None:
            out["dead_worker_gone_s"] = round(now - fault_s, 2)
        new = ids - {dead_id}
        if new:
            out["replacement"], out["replacement_report_s"] = sorted(new)[0], round(now - fault_s, 2)
        if now - last_sample >= 1.0:
            last_sample = now
            out["gpu_memory_mib"].append([round(now - fault_s, 1), gpu_memory_mib()])
        time.sleep(0.25)
    return out


def probe(url: str, model: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    try:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
        ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        return {"ok": ok, "status": r.status_code, "latency_ms": (time.monotonic() - t0) * 1e3}
    except httpx.HTTPError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

"""sglang-router 0.3.2 in front of two stand-in SGLang workers (bench/router/standin_sglang.py, plain HTTP
servers on this machine): what the two-GPU sweep relies on. It forwards /generate's `input_ids` to a
worker, refuses a token-id `prompt` on /v1/completions, and counts each worker's answers in
`smg_worker_cb_outcomes_total`.

Needs the gateway's wheel installed in a folder (as bench/run_serving_gpu.sh installs it into
/tmp/routersite: `python -m pip install --no-deps --target DIR sglang_router-0.3.2-*.whl`, plus setproctitle
and orjson where SGLang's site is not beside it), named by ZIPKV_SGLANG_ROUTER_SITE; skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.router.standin_sglang import StandInSGLang
from bench.serving.serving_systems import GATEWAY_PLACEMENTS, gateway_cmd, placements
from zipkv.stack.local_http import free_port

SITE = os.environ.get("ZIPKV_SGLANG_ROUTER_SITE", "")


def _post(url: str, payload: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


@pytest.fixture
def gateway() -> Iterator[tuple[str, str, list[list[dict[str, Any]]]]]:
    if not SITE or not (Path(SITE) / "sglang_router").is_dir():
        pytest.skip("set ZIPKV_SGLANG_ROUTER_SITE to a folder with sglang-router 0.3.2 installed")
    with StandInSGLang() as one, StandInSGLang() as two:
        port, metrics_port = free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([SITE, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(gateway_cmd("cache_aware", [one.url, two.url], port, metrics_port), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, "the gateway exited"
                assert time.monotonic() < deadline, "the gateway did not answer /health in 60 s"
                time.sleep(0.5)
            yield base, f"http://127.0.0.1:{metrics_port}/metrics", [one.seen, two.seen]
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_the_gateway_forwards_input_ids_and_counts_per_worker(
    gateway: tuple[str, str, list[list[dict[str, Any]]]],
) -> None:
    base, metrics, seen = gateway
    ids = [11, 12, 13, 14]
    code, body = _post(f"{base}/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 3},
                                            "stream": True})  # fmt: skip
    assert code == 200 and '"completion_tokens": 3' in body
    got = [r for log in seen for r in log]  # the stand-ins keep /generate bodies only
    assert len(got) == 1 and got[0]["input_ids"] == ids
    code, body = _post(f"{base}/v1/completions", {"model": "llama", "prompt": ids, "max_tokens": 3})
    assert code == 422 and "StringOrArray" in body  # why the sweep talks /generate to the gateway
    with urllib.request.urlopen(metrics, timeout=5) as resp:
        counts = placements(resp.read().decode(), GATEWAY_PLACEMENTS)
    assert sum(counts.values()) == 1 and all("worker=" in k for k in counts)

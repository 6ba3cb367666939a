"""bench/run_ray_serve_gpu.sh on the CPU (ENGINE=reference): the same script the GPU machine runs, end to end
with a real router process, real Ray Serve and the tiny built-in model, checked through its JSON record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_router_and_serve_replica_answer_both_completions(tmp_path: Path) -> None:
    # The script's `python3` is the interpreter running the tests (its zipkv is this checkout's).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "OUT": str(tmp_path), "ENGINE": "reference", "READY_S": "150", "PATH": path}
    proc = subprocess.run(
        ["bash", "bench/run_ray_serve_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "ray_serve_gpu.json").read_text())
    assert record["ok"] is True and record["engine"] == "reference"
    plain, stream = record["requests"]["non_stream"], record["requests"]["stream"]
    assert plain["response"]["usage"]["completion_tokens"] == 16
    assert plain["response"]["choices"][0]["finish_reason"] == "length"
    assert stream["completion_tokens"] == 16 and stream["finish_reason"] == "length" and stream["text"]
    # The router saw the replica's capacity reports, and the replica itself reports through Serve.
    assert record["router_readyz"]["workers"] == 1
    assert any(k.startswith("zipkv_router_worker_headroom_tokens") for k in record["router_worker_metrics"])
    info = record["replica_info"]
    assert info["reports_accepted"] > 0 and info["capacity"]["total_tokens"] > 0
    assert [w["worker_id"] for w in record["worker_report_after"]] == [info["worker_id"]]
    timings = record["timings_s"]
    assert 0 < timings["ray_start"] < timings["stack_ready"] and timings["replica_ready"] > 0
    assert any(line.split() == ["ok", "True"] for line in proc.stdout.splitlines())  # the summary table

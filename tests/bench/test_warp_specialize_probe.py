"""bench/kernels/warp_specialize_probe.py, compiled by .cache/gluon-venv's Triton 3.6.0 (no GPU): the facts
docs/benchmarks.md draws from it about a producer warp for the Hopper decode kernel."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GLUON_PY = ROOT / ".cache/gluon-venv/bin/python"


def _probe(*args: str) -> list[dict[str, object]]:
    if not GLUON_PY.exists():
        pytest.fail(f"{GLUON_PY} is missing: run scripts/setup.sh (it installs triton==3.6.0 there)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [str(GLUON_PY), "-m", "bench.kernels.warp_specialize_probe", "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_two_warp_program_cannot_take_a_producer_warp_and_a_four_warp_one_can() -> None:
    probed = _probe("--consumers", "2,4", "--maxnreg", "0,128")
    rows = {(r["consumer_warps"], r["maxnreg"]): r for r in probed}
    for cap in (0, 128):
        refused = rows[(2, cap)]
        assert refused["compiles"] is False and "multiple of 4" in str(refused["error"]), refused
        ok = rows[(4, cap)]
        # the one producer warp is padded to a warpgroup: eight warps a program
        assert ok["compiles"] is True and ok["threads"] == 256, ok
    # Capped at 128 registers a thread (two programs of 256 threads an SM), the consumers are given more
    # than the 199 the kernel holds today and the producer warpgroup far fewer.
    capped = rows[(4, 128)]
    assert max(capped["setmaxnreg_inc"]) > 199 >= 48 >= min(capped["setmaxnreg_dec"]), capped  # type: ignore[arg-type]

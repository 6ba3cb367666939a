"""bench/kernels/bench_extend_attention.py on the CPU (Triton interpreter, tiny shapes): the script the GPU
machine runs, end to end, checked through its JSON record (a smoke run of the script, not a benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_impl_is_timed_and_every_check_passes(tmp_path: Path) -> None:
    out = tmp_path / "extend.json"
    cmd = [sys.executable, "-m", "bench.kernels.bench_extend_attention", "--device", "cpu",
           "--shapes", "2x40x9", "--fractions", "real,0", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] is False and record["device"].startswith("cpu")
    impls = {"zipkv", "zipkv_twin", "decompress_then_attend", "sdpa"}
    for fraction in {r["compressible_fraction"] for r in record["rows"]}:
        assert {r["impl"] for r in record["rows"] if r["compressible_fraction"] == fraction} == impls
    fractions = {c["data"]: c["compressible_fraction"] for c in record["checks"]}
    # real KV codes at its own fraction (most blocks, not all); the synthetic entry 0 is all raw
    assert len(record["checks"]) == 2 and fractions["synthetic"] == 0.0 and 0.5 < fractions["real"] < 1.0
    assert "SmolLM2" in record["data"]["real"]
    for check in record["checks"]:
        assert check["bit_identical_to_twin"] and check["decompress_then_attend_identical"]
        assert check["rel_err_zipkv"] < 1e-2 and check["rel_err_sdpa"] < 1e-2

"""bench/kernels/bench_codec.py on the CPU (Triton interpreter, two pages): the script the GPU machine runs,
end to end at formats v3 and v2, checked through its JSON record (a smoke run of the script, not a benchmark;
the script itself checks every kernel output bit for bit before timing it, and exits non-zero if one
differs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("version", "data"), [(3, ["normal", "raw"]), (2, ["normal"])])
def test_the_codec_bench_checks_and_times_a_format(tmp_path: Path, version: int, data: list[str]) -> None:
    out = tmp_path / "codec.json"
    cmd = [sys.executable, "-m", "bench.kernels.bench_codec", "--device", "cpu", "--layers", "1",
           "--pages-per-layer", "2", "--reps", "1", "--warmups", "0", "--encode-warps", "4",
           "--decode-warps", "4", "--decode-page-heads", "1", "--format-version", str(version),
           "--data", *data, "--out", str(out)]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] is False and record["device"].startswith("cpu")
    assert record["shape"]["format_version"] == version and set(record["results"]) == set(data)
    normal = record["results"]["normal"]
    assert 0.75 <= normal["stored_over_raw"] < 0.8 and normal["compressible_block_fraction"] > 0.9
    assert set(normal["decode_ms_by_config"]) == {"g1-w4-int", "g1-w4-int-cs"}
    for row in record["results"].values():
        assert row["encode_ms"] > 0 and row["decode_ms"] > 0 and row["copy_ms"] > 0
    if "raw" in data:  # random bit patterns: every v3 page is stored raw
        assert record["results"]["raw"]["stored_over_raw"] == 1.0

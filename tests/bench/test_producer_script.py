"""bench/run_producer_gpu.sh's gate: the producer kernel's smoke runs first, and only when every case
passes do the benchmark (and the profile) run; a failed or hung smoke stops the call with a line that says
which. ``python3`` and ``nvidia-smi`` are scripts here that log their arguments (no GPU)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, smoke_rc: int) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    # the smoke exits with smoke_rc (124 is what timeout gives a hang); everything else succeeds
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *producer_smoke*) exit {smoke_rc} ;; esac\nexit 0\n'
    )
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "gpu_env.sh").write_text(f"OUT={tmp_path}\nwarm_flashinfer() {{ :; }}\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NCU": "0",
           "ZIPKV_GPU_ENV": str(tmp_path / "gpu_env.sh")}  # fmt: skip
    proc = subprocess.run(
        ["bash", "bench/run_producer_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("smoke_rc", "says"), [(1, "a case failed"), (124, "it timed out")])
def test_a_failed_or_hung_smoke_stops_the_call_before_the_benchmark(
    tmp_path: Path, smoke_rc: int, says: str
) -> None:
    proc, calls = run(tmp_path, smoke_rc)
    assert proc.returncode == 0 and f"producer smoke rc={smoke_rc}" in proc.stdout and says in proc.stdout
    assert len(calls) == 1 and "bench.kernels.producer_smoke" in calls[0], calls


def test_a_passing_smoke_goes_on_to_the_benchmark_of_both_kernels(tmp_path: Path) -> None:
    proc, calls = run(tmp_path, 0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c.split()[1] for c in calls] == [
        "bench.kernels.producer_smoke",
        "bench.kernels.bench_decode_hopper",
    ]
    assert "--configs 32:2:0:0:2:0:0:1,64:2:2:0:4:0:0:1:0:0:1:1,64:2:2:0:4:0:0:1:0:0:1:2" in calls[1], calls

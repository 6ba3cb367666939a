"""bench/run_decode_hopper_gpu.sh's card check: with REQUIRE_GPU set it stops in seconds on any other card
(the device tool may hand out an H100 for a call that wants the H200's figures), before installing or
compiling anything; on the named card it goes on. nvidia-smi is a script here that names a card."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, card: str, require: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{card}'\n")
    smi.chmod(0o755)
    # gpu_env.sh is what a passing check reaches first: here a stand-in that says so and stops
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path),
           "REQUIRE_GPU": require, "ZIPKV_GPU_ENV": str(tmp_path / "gpu_env.sh")}  # fmt: skip
    (tmp_path / "gpu_env.sh").write_text("echo REACHED gpu_env; exit 7\n")
    return subprocess.run(
        ["bash", "bench/run_decode_hopper_gpu.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("card", "require", "skipped"),
    [
        ("NVIDIA H100 80GB HBM3", "H200", True),
        ("NVIDIA H200", "H200", False),
        ("NVIDIA H100 80GB HBM3", "H100", False),
    ],
)
def test_a_required_card_is_checked_before_anything_else(
    tmp_path: Path, card: str, require: str, skipped: bool
) -> None:
    proc = run(tmp_path, card, require)
    if skipped:
        assert proc.returncode == 0 and f"SKIPPED: this card is {card}, not {require}" in proc.stdout
        assert "REACHED" not in proc.stdout
    else:
        assert proc.returncode == 7 and "REACHED gpu_env" in proc.stdout, proc.stdout + proc.stderr

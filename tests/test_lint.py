"""ruff and mypy stay clean: the configuration lives in pyproject.toml (`make lint` runs the same)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["controlplane", "worker", "kernels", "allocator", "protos", "stack", "testing", "bench"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_clean(args: list[str]) -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff not installed: run `bash scripts/setup.sh` (installs zipkv[dev])")
    result = _run([ruff, *args])
    assert result.returncode == 0, f"ruff {' '.join(args)} found problems:\n{result.stdout}{result.stderr}"


def test_mypy_clean() -> None:
    result = _run([sys.executable, "-m", "mypy", *PACKAGES])
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"

"""Running a bench module under .cache/gluon-venv's Triton 3.6.0 (scripts/setup.sh puts it beside this
environment's Triton): the Gluon API the Hopper kernel and the offline probes are written against."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLUON_PY = ROOT / ".cache/gluon-venv/bin/python"


def run_module(module: str, *args: str, timeout_s: int = 600) -> str:
    """``python -m module args`` in the Gluon venv from the repo root; its stdout, or the test fails with
    what to do."""
    if not GLUON_PY.exists():
        pytest.fail(f"{GLUON_PY} is missing: run scripts/setup.sh (it installs triton==3.6.0 there)")
    where = subprocess.run(
        [str(GLUON_PY), "-c", "import zipkv.kernels, os; print(os.path.realpath(zipkv.kernels.__file__))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if Path(where.stdout.strip()).parent != (ROOT / "kernels").resolve():
        pytest.fail(
            f"{GLUON_PY} imports zipkv from {where.stdout.strip()!r}, not this checkout: run scripts/setup.sh"
        )
    # Not under the interpreter, which other tests of this run switch on for their process and children.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [str(GLUON_PY), "-m", module, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-1500:]
    return done.stdout

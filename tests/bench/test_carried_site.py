"""bench/gpu_env.sh's FlashInfer: the carried wheels (.carry/whl) when a call carries them, else the carried
SGLang site (bench/carried_site.sh), extracted once a machine, so one carry serves a session's kernel and
SGLang calls; neither carried is a clear failure. python3 is a script here that logs its arguments."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path, wheels: bool, site_tarball: bool) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "bench").symlink_to(ROOT / "bench")
    if wheels:
        (work / ".carry" / "whl").mkdir(parents=True)
        (work / ".carry" / "whl" / "flashinfer_python-0.6.15.post1-py3-none-any.whl").write_bytes(b"")
    if site_tarball:
        src = tmp_path / "site_src" / "flashinfer"
        src.mkdir(parents=True)
        (src / "__init__.py").write_text("VERSION = 'carried'\n")
        (work / ".carry" / "sglang" / "parts").mkdir(parents=True)
        with tarfile.open(work / ".carry" / "sglang" / "parts" / "site.tar.xz", "w:xz") as tar:
            tar.add(src, arcname="./flashinfer")
    return work


def _source_gpu_env(tmp_path: Path, work: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "python3.log"}\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "ZIPKV_SITE": str(tmp_path / "site")}  # fmt: skip
    return subprocess.run(
        ["bash", "-c", 'source bench/gpu_env.sh && echo "PYTHONPATH=$PYTHONPATH"'],
        cwd=work, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _python3_calls(tmp_path: Path) -> str:
    log = tmp_path / "python3.log"
    return log.read_text() if log.exists() else ""


def test_the_carried_wheels_go_into_the_site_when_carried(tmp_path: Path) -> None:
    work = _tree(tmp_path, wheels=True, site_tarball=True)
    proc = _source_gpu_env(tmp_path, work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = _python3_calls(tmp_path)
    assert f"--target {tmp_path / 'site'} .carry/whl/flashinfer_python-0.6.15.post1-py3-none-any.whl" in calls
    assert not (tmp_path / "site" / "flashinfer").exists()  # the SGLang site is left for the SGLang call
    assert f"PYTHONPATH={tmp_path / 'site'}" in proc.stdout


def test_without_the_wheels_the_sglang_site_is_extracted_once(tmp_path: Path) -> None:
    work = _tree(tmp_path, wheels=False, site_tarball=True)
    proc = _source_gpu_env(tmp_path, work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "flashinfer" / "__init__.py").read_text() == "VERSION = 'carried'\n"
    assert "--target" not in _python3_calls(tmp_path)  # no wheels installed
    assert f"PYTHONPATH={site}" in proc.stdout
    # A later call on the same machine finds it there: nothing extracted again, even without the carry.
    (site / "flashinfer" / "__init__.py").write_text("VERSION = 'kept'\n")
    (work / ".carry" / "sglang" / "parts" / "site.tar.xz").unlink()
    again = _source_gpu_env(tmp_path, work)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (site / "flashinfer" / "__init__.py").read_text() == "VERSION = 'kept'\n"


def test_neither_carried_fails_and_says_what_to_carry(tmp_path: Path) -> None:
    work = _tree(tmp_path, wheels=False, site_tarball=False)
    proc = _source_gpu_env(tmp_path, work)
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout and "scripts/build_sglang_carry.sh" in proc.stdout, proc.stdout
    assert "PYTHONPATH=" not in proc.stdout and _python3_calls(tmp_path) == ""

"""Shared pytest setup: the `gpu` marker skips without CUDA; a real redis-server on loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine (docs/benchmarks.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def free_port() -> int:
    """A free TCP port on loopback (bound and released; good enough for tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """Start a real redis-server on loopback; fail with what to do when it is not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server not found: run `bash scripts/setup.sh` (installs Debian's redis-server)")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail(f"redis-server did not start on port {port} within 10 s")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A fresh redis-server; yields (url, process) and stops it afterwards."""
    port = free_port()
    proc = start_redis(tmp_path, port)
    yield f"redis://127.0.0.1:{port}/0", proc
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()

"""Real servers for tests: a free loopback port and a redis-server (imported as `servers`: tests/ is on
sys.path because tests/conftest.py lives there)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


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

"""Real servers for tests: a free loopback port and a redis-server (imported as `servers`: tests/ is on
sys.path because tests/conftest.py lives there)."""

from __future__ import annotations

import contextlib
import random
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


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports, for a stack whose router k listens on
    ``port + k``. Taken below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so
    that no outgoing connection is handed one of them between this check and the routers' bind: a base
    from free_port() sits inside that range, and its neighbour once was taken that way ("address already
    in use" for router 1 in CI)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(max(low - 12000, 1025), low - count)
        if all(_bindable(base + k) for k in range(count)):
            return base
    raise RuntimeError(f"no run of {count} free loopback ports below {low}: free some, then re-run")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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

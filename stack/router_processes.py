"""The router processes of a local stack: each spawned from its config file with its own log and tied to
this process's life, waited on until it answers, restarted when it exits (but not while it crash-loops),
and stopped.

Split from local_stack.py, which decides what runs (the configs, ports and tokens, the workers): this is
the process plumbing, the same for every router.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

MAX_RESTARTS_PER_MIN = 5
LOG_TAIL_CHARS = 3000  # how much of a router's log an error quotes


def _die_with_parent() -> None:
    """Linux: the router gets SIGTERM if this process dies without stopping it (e.g. SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def router_config(
    http_port: int,
    grpc_port: int,
    model: dict[str, Any],
    report_token: str,
    dispatch_token: str,
    redis_url: str | None,
) -> dict[str, Any]:
    """One router's config on loopback: its ports, the one model, the stack's tokens, shared state if any."""
    config: dict[str, Any] = {
        "http": {"host": "127.0.0.1", "port": http_port},
        "grpc": {"host": "127.0.0.1", "port": grpc_port},
        "models": [model],
        "security": {"report_token": report_token, "dispatch_token": dispatch_token},
    }
    if redis_url:
        config["state"] = {"backend": "redis", "redis_url": redis_url}
    return config


def spawn_router(config: Path, log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """`python -m zipkv.controlplane --config config`, its output appended to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 (lives as long as the process)
    return subprocess.Popen(
        [sys.executable, "-m", "zipkv.controlplane", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,  # Ctrl-C reaches us once; we stop the router ourselves
        preexec_fn=_die_with_parent,
    )


def exited_error(k: int, proc: subprocess.Popen[bytes], log_text: str) -> RuntimeError:
    return RuntimeError(f"router {k} exited with code {proc.returncode}:\n{log_text[-LOG_TAIL_CHARS:]}")


def wait_answering(
    k: int,
    proc: subprocess.Popen[bytes],
    answers: Callable[[], bool],
    log_text: Callable[[], str],
    deadline: float,
    what: str,
) -> None:
    """Poll ``answers`` (an OSError counts as no) until it says yes; raise if the router exits first or
    ``deadline`` (monotonic) passes (TimeoutError naming ``what`` it did not answer)."""
    while True:
        if proc.poll() is not None:
            raise exited_error(k, proc, log_text())
        try:
            if answers():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"router {k} did not answer {what}")
        time.sleep(0.2)


class RestartBudget:
    """At most `MAX_RESTARTS_PER_MIN` restarts of each router within a minute: past that it is
    crash-looping, and restarting it again would only hide why."""

    def __init__(self) -> None:
        self._restarts: dict[int, list[float]] = {}

    def spend(self, k: int, proc: subprocess.Popen[bytes], now: float, log_text: Callable[[], str]) -> None:
        """Count a restart of router ``k`` (which exited) at ``now``; RuntimeError, with its log, if the
        budget is spent."""
        recent = [t for t in self._restarts.get(k, []) if now - t < 60.0]
        if len(recent) >= MAX_RESTARTS_PER_MIN:
            raise RuntimeError(
                f"router {k} exited {len(recent) + 1} times within a minute "
                f"(last code {proc.returncode}); giving up:\n{log_text()[-LOG_TAIL_CHARS:]}"
            )
        self._restarts[k] = [*recent, now]


def write_pids(path: Path, procs: list[subprocess.Popen[bytes]], base_urls: list[str]) -> None:
    """Router process ids, for fault drills (scripts/fault_suite.sh kills one by its id)."""
    path.write_text(json.dumps({"routers": [p.pid for p in procs], "base_urls": base_urls}))


def stop_routers(procs: list[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """SIGTERM to every router still running, then wait; a router that does not stop in time is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()

"""Start a local Ray head for the worker replicas, patiently, and say why when it does not come up; stop it
with its Serve app drained.

Ray's driver waits 30 s for the GCS to write its port file and another 30 s (fixed) for the raylet to
register. A busy 2-core machine has run past both in turn (seen once in CI: the GCS wait on the first
try, the raylet's on the second). So the GCS wait is longer (`RAY_gcs_server_port_wait_time_s`, unless
the operator set it), a start gets three tries, and a failure carries the GCS log tail.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

GCS_PORT_WAIT_S = 60  # the driver's wait for the GCS port file; Ray's own default is 30
ATTEMPTS = 3
RAY_SESSION_LOGS = Path("/tmp/ray/session_latest/logs")


def gcs_log_tail(lines: int = 8, logs_dir: Path | None = None) -> str:
    """The last lines of the newest session's GCS logs, or '' when there are none."""
    logs_dir = RAY_SESSION_LOGS if logs_dir is None else logs_dir
    tails = []
    for name in ("gcs_server.err", "gcs_server.out"):
        path = logs_dir / name
        if path.is_file():
            text = path.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                tails.append(f"{name}: " + " | ".join(text))
    return "; ".join(tails)


def start_local_ray(
    num_cpus: int, env_vars: dict[str, str], say: Callable[[str], None], **init_kwargs: Any
) -> None:
    """`ray.init` of a local head (no dashboard, quiet driver); `env_vars` reach every replica.

    Three tries; the error after the last says what the GCS logged and what to check."""
    import ray

    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_PORT_WAIT_S))
    for attempt in range(1, ATTEMPTS + 1):
        try:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
                configure_logging=True,
                runtime_env={"env_vars": env_vars},
                **init_kwargs,
            )
            return
        except Exception as exc:
            ray.shutdown()
            logs = gcs_log_tail()
            detail = f"{exc}" + (f"; GCS log: {logs}" if logs else "")
            if attempt == ATTEMPTS:
                raise RuntimeError(
                    f"Ray did not start ({detail}); check that no other Ray is still stopping (`ray stop`) "
                    f"and that {RAY_SESSION_LOGS.parent.parent} is writable"
                ) from exc
            say(f"Ray did not start ({detail}); try {attempt + 1} of {ATTEMPTS}")


def stop_local_ray(app_name: str) -> None:
    """Delete the Serve app (graceful: each replica drains, its __del__, before it goes), then Ray."""
    import ray
    from ray import serve

    try:
        serve.delete(app_name)
    finally:
        ray.shutdown()

"""The stack that bench/serving/ray_serve_gpu.py checks: `zipkv up`'s router and its Ray Serve worker replicas
(one unless the options say more; the serving sweep's two-GPU run starts two), started
with that bench's engine, waited on until the replica reports, and queried through Serve.

Kept apart from the request checks and the JSON record so that this side (start, readiness, stop, the
replica's logs) reads on its own: it is where a slow or failed start shows up, and the readiness wait
reports progress because an SGLang replica can take minutes to start.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from zipkv.stack.local_stack import APP_NAME, LocalStack
from zipkv.stack.options import StackOptions

# Where Ray writes the replica's Serve log; named in the timeout error so the reader knows where to look.
REPLICA_LOG_GLOB = "/tmp/ray/session_latest/logs/serve/replica_*.log"


class ServeStack(LocalStack):
    """`zipkv up`'s stack (router process, status tap, local Ray, Serve app) with the engine chosen here:
    the byte tokenizer at the router and worker arguments beyond `zipkv up`'s (engine, GPUs, SGLang's)."""

    def __init__(
        self, options: StackOptions, worker_args: dict[str, Any], num_gpus: int, wait_note: str = ""
    ) -> None:
        super().__init__(options, progress=lambda line: print(line, flush=True))
        self.worker_args = worker_args
        self.num_gpus = num_gpus
        self.wait_note = wait_note
        self.timings_s: dict[str, float] = {}
        self.deploy_error: BaseException | None = None

    def _router_config(self, k: int) -> Path:
        path = super()._router_config(k)
        config = json.loads(path.read_text())
        config["models"][0]["tokenizer"] = "byte"  # a dummy-weights model folder holds no tokenizer
        path.write_text(json.dumps(config, indent=2))
        return path

    def _start_workers(self, report_addresses: list[str]) -> None:
        from ray import serve

        from zipkv.worker.serve import app_builder

        o = self.options
        t0 = time.monotonic()
        self._say(f"starting Ray (local head, {o.ray_num_cpus} CPUs, {self.num_gpus} GPU(s))")
        self.start_ray(
            num_gpus=self.num_gpus,
            object_store_memory=256 << 20,  # nothing large crosses Ray here
            _node_ip_address="127.0.0.1",  # no network on the GPU machine; everything is local
        )
        self.timings_s["ray_start"] = time.monotonic() - t0
        self._say(f"Ray up in {self.timings_s['ray_start']:.1f} s")
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        serve.start(proxy_location="Disabled")
        args = {**self.replica_args(report_addresses, o.workers), **self.worker_args}
        self._say(f"starting {o.workers} worker replica(s): {json.dumps(args)}")
        self.timings_s["serve_run_at"] = time.monotonic()
        # serve.run returns only once the replica's constructor (the engine's whole start-up) is done; on a
        # thread, so that the wait below keeps its deadline and shows progress meanwhile.
        app = app_builder(args)
        threading.Thread(target=self._serve_run, args=(app,), name="zipkv-serve-run", daemon=True).start()

    def _serve_run(self, app: Any) -> None:
        from ray import serve

        try:
            serve.run(app, name=APP_NAME, route_prefix=None, blocking=False)
        except BaseException as exc:  # reported by _wait_ready
            self.deploy_error = exc

    def _wait_ready(self, timeout_s: float) -> None:
        t0 = time.monotonic()
        last_note = t0
        want = self.options.workers  # every replica reports before the stack counts as up
        while len(self.workers()) < want:
            now = time.monotonic()
            self._raise_if_failed(now - t0, timeout_s)
            if now - last_note >= 15.0:
                last_note = now
                tail = replica_log_tail(1)
                self._say(
                    f"waiting for the replicas' first reports ({len(self.workers())}/{want} in, "
                    f"{now - t0:.0f} s){self.wait_note}"
                    + (f"\n      last log line: {tail[-1]}" if tail else "")
                )
            time.sleep(0.3)
        self._say(f"{want}/{want} workers reporting: ready")

    def _raise_if_failed(self, waited_s: float, timeout_s: float) -> None:
        """Fail the wait at once when the replica's start raised or a router exited, not at the deadline."""
        if self.deploy_error is not None:
            raise RuntimeError(f"the worker replica failed to start: {self.deploy_error}")
        for k, proc in enumerate(self.routers):
            if proc.poll() is not None:
                raise RuntimeError(f"router {k} exited ({proc.returncode}):\n{self.router_log(k)[-3000:]}")
        if waited_s > timeout_s:
            raise TimeoutError(
                f"the replica sent no report within {timeout_s:.0f} s{self.wait_note}; its log: "
                f"{REPLICA_LOG_GLOB}"
            )


def replica_log_tail(lines: int = 6) -> list[str]:
    """The last lines of the newest replica logs and Ray worker stderr files, each prefixed by its file."""
    logs = sorted(glob.glob(REPLICA_LOG_GLOB), key=os.path.getmtime)
    logs += sorted(glob.glob("/tmp/ray/session_latest/logs/worker-*.err"), key=os.path.getmtime)[-2:]
    out: list[str] = []
    for path in logs[-3:]:
        text = Path(path).read_text(errors="replace").splitlines()
        out += [f"{Path(path).name}: {line[:300]}" for line in text[-lines:]]
    return out


def replica_info() -> dict[str, Any]:
    """The replica's own report, asked through Serve (not the router), so both views can be compared."""
    from ray import serve

    info: dict[str, Any] = serve.get_app_handle(APP_NAME).remote().result(timeout_s=30)
    return info

"""The router starts from the chart's rendered ConfigMap, command and environment, and answers the probes
the chart gives it: run as the pod would run it (`python -m zipkv.controlplane --config ...`), on
loopback, with a real Redis when the chart points it at one."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_render import container_env, containers, free_port, one, render, router_config_text

pytestmark = pytest.mark.timeout(120)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:  # a 503 from /readyz is an answer too
        return int(exc.code), exc.read()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"router exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if _get(url)[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"router did not answer {url} within 60 s:\n{log.read_text()[-3000:]}")


TLS_DIR = "/etc/zipkv-tls"  # where the chart mounts its gRPC TLS Secret


def _tls_files(objs: list[dict[str, Any]], tmp_path: Path) -> str:
    """The chart's gRPC TLS Secret written out as the pod's volume would show it; returns the folder."""
    folder = tmp_path / "grpc-tls"
    folder.mkdir(exist_ok=True)
    secret = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("grpc-tls"))
    for key, value in secret["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return str(folder)


def _start_router(objs: list[dict[str, Any]], tmp_path: Path, secrets: Any = None) -> subprocess.Popen[bytes]:
    """Start the router with the Deployment's command, the ConfigMap as its file and the pod's env (and
    the chart's TLS Secret as files)."""
    container = next(containers(one(objs, "Deployment", "router")))
    config = tmp_path / "router.yaml"
    config.write_text(router_config_text(objs).replace(TLS_DIR, _tls_files(objs, tmp_path)))
    args = [a.replace("/etc/zipkv/router.yaml", str(config)) for a in container["args"]]
    assert container["command"][0] == "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZIPKV_", "OTEL_"))}
    env |= container_env(container, objs, secrets)
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *container["command"][1:], *args], env=env, stdout=out, stderr=subprocess.STDOUT
        )


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _probe_urls(objs: list[dict[str, Any]], http_port: int) -> list[str]:
    container = next(containers(one(objs, "Deployment", "router")))
    paths = [container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    return [f"http://127.0.0.1:{http_port}{p}" for p in [*paths, "/metrics"]]


def _ports() -> dict[str, Any]:
    return {"httpPort": free_port(), "grpcPort": free_port()}


def test_router_boots_from_the_dev_example_config(tmp_path: Path, stop: list[Any]) -> None:
    """One router, state in memory: the single-GPU dev install (byte tokenizer: no model folder here)."""
    ports = _ports()
    objs = render(
        {"router": {"replicas": 1, **ports}, "redis": {"enabled": False}, "model": {"tokenizer": "byte"}}
    )
    proc = _start_router(objs, tmp_path)
    stop.append(proc)
    urls = _probe_urls(objs, ports["httpPort"])
    _wait_ready(urls[0], proc, tmp_path / "router.log")
    startup, liveness, readiness, metrics = urls
    for url in (startup, liveness, metrics):
        assert _get(url)[0] == 200, url
    status, body = _get(readiness)  # no worker reports here: honestly not ready, and it says why
    assert status == 503 and b"no_worker" in body, body
    assert b"zipkv_router" in _get(metrics)[1]


def test_router_boots_against_a_password_protected_redis(tmp_path: Path, stop: list[Any]) -> None:
    """Two routers' worth of config (Redis state) with the password added from the Secret at start-up."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server not found: run `bash scripts/setup.sh` (installs Debian's redis-server)")
    password = "chartRedisPassw0rd"
    redis_port = free_port()
    redis = subprocess.Popen(
        [exe, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--requirepass", password, "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    stop.append(redis)
    ports = _ports()
    objs = render(
        {
            "router": ports,
            "model": {"tokenizer": "byte"},
            "redis": {
                "enabled": False,
                "external": {"url": f"redis://127.0.0.1:{redis_port}/0"},
                "auth": {"existingSecret": "state", "existingSecretKey": "pw"},
            },
        }
    )
    proc = _start_router(objs, tmp_path, {"state": {"pw": password}})
    stop.append(proc)
    urls = _probe_urls(objs, ports["httpPort"])
    _wait_ready(urls[0], proc, tmp_path / "router.log")
    # /readyz says "degraded" while the router cannot read the shared state (a wrong password does that).
    deadline = time.monotonic() + 10
    while True:
        status, body = _get(urls[2])
        if b'"degraded":false' in body.replace(b" ", b"") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert b'"degraded":false' in body.replace(b" ", b""), body
    # No worker reports here, so it is honestly not ready (503) and says why.
    assert status == 503 and b"no_worker" in body, body


@pytest.mark.slow
@pytest.mark.timeout(240)
def _serve_workers(
    serve_yaml: Path, env: dict[str, str], ready_url: str, worker_log: Path, stop: list[Any]
) -> None:
    """Real Ray Serve deploying ``serve_yaml`` with ``env`` (stopped first, by the ``stop`` fixture), until
    the router at ``ready_url`` counts one worker; fails with Serve's log if it exits or none arrives in
    180 s."""
    with worker_log.open("wb") as out:
        workers = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("serve_from_config.py")), str(serve_yaml)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    stop.insert(0, workers)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if workers.poll() is not None:
            pytest.fail(f"Ray Serve exited with {workers.returncode}:\n{worker_log.read_text()[-4000:]}")
        body = _get(ready_url)[1].replace(b" ", b"")
        if b'"workers":1' in body:
            return
        time.sleep(0.5)
    pytest.fail(f"no worker reached the router in 180 s:\n{worker_log.read_text()[-4000:]}")


def test_rendered_serve_config_reports_to_the_router(tmp_path: Path, stop: list[Any]) -> None:
    """The RayService's Serve config, deployed by real Ray Serve with the Ray pods' environment, brings a
    worker that the router accepts: the report token from the chart's Secret matches on both sides.

    Local stand-ins, set through the chart's own values: the reference engine on the CPU with its
    built-in tiny model, and the router's loopback address instead of its in-cluster Service name.
    """
    ports = _ports()
    values = {
        "router": {"replicas": 1, **ports},
        "redis": {"enabled": False},
        "model": {"name": "zipkv-tiny", "tokenizer": "byte"},
        "workers": {
            "engine": "reference",
            "reportIntervalMs": 100,
            "extraArgs": {"router": f"127.0.0.1:{ports['grpcPort']}", "model": "", "gpus_per_replica": 0,
                          "cpus_per_replica": 1, "kv_budget_mib": 8},
        },
    }  # fmt: skip
    objs = render(values)
    router = _start_router(objs, tmp_path)
    stop.append(router)
    urls = _probe_urls(objs, ports["httpPort"])
    _wait_ready(urls[0], router, tmp_path / "router.log")

    serve_yaml = tmp_path / "serve.yaml"
    serve_yaml.write_text(one(objs, "RayService")["spec"]["serveConfigV2"])
    ray_container = next(containers(one(objs, "RayService")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZIPKV_", "OTEL_"))}
    env |= container_env(ray_container, objs) | {"RAY_USAGE_STATS_ENABLED": "0"}
    tls_dir = _tls_files(objs, tmp_path)  # the Ray pods mount the same Secret's worker files
    env = {k: v.replace(TLS_DIR, tls_dir) for k, v in env.items()}
    assert env["ZIPKV_TLS_CERT"].startswith(tls_dir) and env["ZIPKV_WORKER_IDENTITY"] == "zipkv-worker"
    _serve_workers(serve_yaml, env, urls[2], tmp_path / "serve.log", stop)
    assert _get(urls[2])[0] == 200  # ready once a worker of the model reports
    router_env = container_env(next(containers(one(objs, "Deployment", "router"))), objs)
    key = json.loads(router_env["ZIPKV_SECURITY__API_KEYS"])[
        0
    ]  # the chart generated one: the API is not open
    assert _get(f"http://127.0.0.1:{ports['httpPort']}/v1/models")[0] == 401
    request = urllib.request.Request(
        f"http://127.0.0.1:{ports['httpPort']}/v1/models", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert b"zipkv-tiny" in resp.read()

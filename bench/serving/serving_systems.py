"""Start and stop the systems the serving sweep compares, each behind an OpenAI /v1/completions endpoint.

    zipkv               zipkv's router + one Ray Serve replica running SGLang with zipkv (`zipkv up`'s stack,
                        bench/serving/ray_serve_gpu_stack.py), the id tokenizer at the router
    zipkv_uncompressed  the same with compression off (zipkv's pool and kernel, no page compressed)
    zipkv_shed          zipkv with the router's SLO shed on (zipkv_systems.py says why)
    sglang_gateway      SGLang's own server (`python -m sglang.launch_server`, FlashInfer), measured
                        directly: with one worker SGLang's gateway only proxies, and sglang-router 0.3.2
                        refuses token-id prompts on its OpenAI endpoint (422: "prompt: data did not match
                        any variant of untagged enum StringOrArray", seen on a CPU in front of a zipkv
                        router), so the token-id trace cannot go through it; its routing policies are
                        compared in the cluster simulation
With `engine=reference` (a CPU, the tiny built-in model) the zipkv systems run as `zipkv up` runs them;
SGLang's server needs a GPU.

With `replicas` > 1 (one GPU each, unless `gpus` says fewer):
    zipkv, zipkv_uncompressed   the router + that many Ray Serve replicas, each with `num_gpus=1` (Ray sets
                        each replica's CUDA_VISIBLE_DEVICES), each with the whole per-replica KV budget
    sglang_gateway_POLICY       one SGLang server per replica (CUDA_VISIBLE_DEVICES=k, the same flags and
                        KV budget as above) behind sglang-router 0.3.2
                        (`python -m sglang_router.launch_router`) with --policy POLICY. The gateway
                        takes token ids on /generate (`input_ids`, which it forwards and routes on),
                        not on /v1/completions (the 422 above; both checked on a CPU against stand-in
                        workers), so the client talks /generate to it
                        (serving_client.GATEWAY_BACKEND). 0.3.2's policies are random, round_robin,
                        cache_aware, power_of_two and manual: it has no `least_load`; its load-aware policy
                        is power_of_two (the less loaded of two workers drawn, by in-flight requests: with
                        two workers, always the less loaded one), the stand-in for least_load here.
With `gpus` < `replicas` the replicas share the GPUs evenly (Ray: `num_gpus=gpus/replicas` each; SGLang's
servers: device k mod gpus): the two-replica stack's dry run on one GPU, each engine with a KV budget that
lets both fit (bench/run_two_gpu.sh, ONE_GPU=1).

SGLang's command lines and its processes' handling (spawn, wait, stop): bench/serving/sglang_processes.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.router.sglang_gateway import GATEWAY_CHOICES, gateway_cmd
from bench.serving.sglang_processes import (
    MODEL_NAME,
    server_envs,
    sglang_server_cmd,
    spawn,
    stopper,
    wait_http,
)
from bench.serving.zipkv_systems import ZIPKV_SYSTEMS, ZipkvSystem
from zipkv.stack.local_http import free_port
from zipkv.stack.options import StackOptions

GATEWAY_POLICIES = ("cache_aware", "power_of_two")  # the two the two-GPU sweep compares (module doc)
GATEWAY_PREFIX = "sglang_gateway_"
SYSTEMS = (*ZIPKV_SYSTEMS, "sglang_gateway", *(GATEWAY_PREFIX + p for p in GATEWAY_CHOICES))


def gateway_policy(system: str) -> str | None:
    """The gateway policy a system name asks for (`sglang_gateway_cache_aware` -> cache_aware); None for
    the systems without SGLang's gateway (zipkv's, and `sglang_gateway`: SGLang's server directly)."""
    if not system.startswith(GATEWAY_PREFIX):
        return None
    policy = system[len(GATEWAY_PREFIX) :]
    if policy not in GATEWAY_CHOICES:
        raise ValueError(f"{system}: sglang-router 0.3.2 has no policy {policy!r} (it has {GATEWAY_CHOICES})")
    return policy


def client_backend(system: str) -> str:
    """bench_serving's backend for a system: /generate with input_ids through the gateway, else the
    OpenAI completions endpoint (serving_client.py)."""
    from bench.serving.serving_client import BACKEND, GATEWAY_BACKEND

    return GATEWAY_BACKEND if gateway_policy(system) else BACKEND


@dataclass(frozen=True)
class ReplicaPlan:
    """How a zipkv stack of `workers` replicas is laid out: Ray's GPU count, each replica's GPU share
    (1: Ray gives each replica its own device through CUDA_VISIBLE_DEVICES; 0.5: two replicas share one,
    Ray packs them onto the same device), Ray's CPUs."""

    workers: int
    ray_num_gpus: int
    gpus_per_replica: float
    cpus_per_replica: int
    ray_num_cpus: int


def replica_plan(replicas: int, engine: str, gpus: int | None = None) -> ReplicaPlan:
    """`gpus` (default: one per replica) must divide the replicas evenly, so every GPU holds as many."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    ray_gpus = replicas if gpus is None else gpus
    if engine != "sglang":
        ray_gpus = 0  # the reference engine runs on the CPU
    elif ray_gpus < 1 or ray_gpus > replicas or replicas % ray_gpus:
        raise ValueError(f"gpus must be 1..{replicas} and divide the {replicas} replicas, got {gpus}")
    share = ray_gpus / replicas
    # One CPU per replica for its engine thread, and room for Serve's controller and the router's calls.
    return ReplicaPlan(replicas, ray_gpus, share, 1, max(4, 2 * replicas + 2))


ZIPKV_PLACEMENTS = "zipkv_router_placements_total"  # requests per worker, controlplane/metrics.py
GATEWAY_PLACEMENTS = "smg_worker_cb_outcomes_total"  # sglang-router 0.3.2: per worker and outcome (its
# circuit breaker counts every answer a worker gave; its smg_worker_selection_total has no worker label)


@dataclass
class Running:
    base_url: str
    model: str
    note: str
    stop_fns: list[Any] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    # Where the requests each worker got are counted (Prometheus text), and the counter's name: the split
    # over the workers is what the placement policy did.
    placements_url: str = ""
    placements_metric: str = ""

    def stop(self) -> None:
        for fn in reversed(self.stop_fns):
            try:
                fn()
            except Exception as exc:  # stopping must go on; say what failed
                print(f"[serving_systems] stop step failed: {exc}", flush=True)


def start_zipkv(opts: dict[str, Any], system: ZipkvSystem) -> Running:
    sglang = opts["engine"] == "sglang"
    plan = replica_plan(int(opts.get("replicas", 1)), opts["engine"], opts.get("gpus"))
    options = StackOptions(
        port=free_port(),
        workers=plan.workers,
        model_path=os.path.abspath(opts["model"]) if opts["model"] else None,
        model_name=MODEL_NAME if opts["model"] else None,
        kv_budget_mib=opts["kv_budget_mib"],
        compression=system.compression,
        router_env=system.router_env(),
        device="cuda" if sglang else "cpu",
        cpus_per_replica=plan.cpus_per_replica,
        ray_num_cpus=plan.ray_num_cpus,
        max_context_tokens=opts["max_context_tokens"],
    )
    worker_args: dict[str, Any] = {"engine": opts["engine"], "max_running_requests": opts["max_running"]}
    if sglang:
        worker_args.update(
            gpus_per_replica=plan.gpus_per_replica, sglang_args=json.dumps(opts["sglang_args"])
        )
    # Imported here, not at the top: zipkv's stack speaks gRPC through the generated stubs, which need
    # grpcio >= 1.85.1 (carried with Ray); SGLang's own server runs in a site without it.
    from bench.serving.id_tokenizer_stack import IdTokenizerStack

    stack = IdTokenizerStack(opts["tokenizer"], options, worker_args, plan.ray_num_gpus)
    t0 = time.monotonic()
    stack.start(ready_timeout_s=opts["ready_s"])
    note = (
        f"zipkv router + {plan.workers} Ray Serve replica(s) (engine {opts['engine']}, compression "
        f"{system.compression}{_gpu_note(plan) if sglang else ''}; router overrides {system.router_env()})"
    )
    run = Running(stack.base_urls[0], stack.model_name, note, [stack.stop])
    run.placements_url, run.placements_metric = f"{stack.base_urls[0]}/metrics", ZIPKV_PLACEMENTS
    run.timings_s["ready"] = round(time.monotonic() - t0, 1)
    return run


def _gpu_note(plan: ReplicaPlan) -> str:
    if plan.gpus_per_replica == 1:
        return ", one GPU each"
    return f", {plan.workers} sharing {plan.ray_num_gpus} GPU(s), {plan.gpus_per_replica:g} each"


def start_sglang_server(opts: dict[str, Any], out: Path) -> Running:
    if opts["engine"] != "sglang":
        raise SystemExit("sglang_gateway runs SGLang's server, which needs a GPU: use --engine sglang there")
    t0 = time.monotonic()
    port = free_port()
    log = out / "sglang_server.log"
    server = spawn(sglang_server_cmd(opts, port), log)
    note = "sglang.launch_server (FlashInfer), directly: one worker, no gateway"
    run = Running(f"http://127.0.0.1:{port}", MODEL_NAME, note, [stopper(server)])
    wait_http(f"{run.base_url}/v1/models", server, opts["ready_s"], "SGLang's server", log)
    run.timings_s["ready"] = round(time.monotonic() - t0, 1)
    return run


def placements(text: str, metric: str) -> dict[str, float]:
    """A counter's samples from Prometheus text, keyed by their labels (`{worker="...",mode="..."}`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{") or line.startswith(metric + " "):
            key, _, value = line[len(metric) :].rpartition(" ")
            out[key.strip() or "{}"] = out.get(key.strip() or "{}", 0.0) + float(value)
    return out


def start_sglang_gateway(opts: dict[str, Any], out: Path, policy: str) -> Running:
    """One SGLang server per GPU, each on its own device, behind SGLang's gateway with `policy`."""
    if opts["engine"] != "sglang":
        raise SystemExit("the gateway's workers are SGLang's servers; they need a GPU: --engine sglang")
    replicas = int(opts.get("replicas", 1))
    gpus = replica_plan(replicas, "sglang", opts.get("gpus")).ray_num_gpus  # zipkv's layout, checked alike
    t0 = time.monotonic()
    run = Running("", MODEL_NAME, "")
    urls: list[str] = []
    servers: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for k, env in enumerate(server_envs(replicas, dict(os.environ), gpus)):
            port = free_port()
            log = out / f"sglang_server_{k}.log"
            proc = spawn(sglang_server_cmd(opts, port), log, env)
            run.stop_fns.append(stopper(proc))
            urls.append(f"http://127.0.0.1:{port}")
            servers.append((proc, log))
        for k, ((proc, log), url) in enumerate(zip(servers, urls, strict=True)):  # all start at once
            left_s = max(opts["ready_s"] - (time.monotonic() - t0), 1.0)
            wait_http(f"{url}/v1/models", proc, left_s, f"SGLang's server {k}", log)
        run.timings_s["servers_ready"] = round(time.monotonic() - t0, 1)
        port, metrics_port = free_port(), free_port()
        log = out / "sglang_gateway.log"
        gateway = spawn(gateway_cmd(policy, urls, port, metrics_port), log)
        run.placements_url = f"http://127.0.0.1:{metrics_port}/metrics"
        run.placements_metric = GATEWAY_PLACEMENTS
        run.stop_fns.append(stopper(gateway))  # stop() runs last-in-first: the gateway before its servers
        run.base_url = f"http://127.0.0.1:{port}"
        wait_http(f"{run.base_url}/health", gateway, 60.0, "SGLang's gateway", log)
    except BaseException:
        run.stop()
        raise
    run.timings_s["ready"] = round(time.monotonic() - t0, 1)
    run.note = (
        f"sglang-router 0.3.2 --policy {policy} (POST /generate with input_ids) in front of {replicas} "
        "sglang.launch_server (FlashInfer), "
        + ("one GPU each" if gpus == replicas else f"sharing {gpus} GPU(s)")
    )
    return run


def start(system: str, opts: dict[str, Any], out: Path) -> Running:
    if system in ZIPKV_SYSTEMS:
        return start_zipkv(opts, ZIPKV_SYSTEMS[system])
    if system == "sglang_gateway":
        if int(opts.get("replicas", 1)) != 1:
            named = ", ".join(GATEWAY_PREFIX + p for p in GATEWAY_POLICIES)
            raise SystemExit(f"sglang_gateway: SGLang's one server, directly; for more, one of: {named}")
        return start_sglang_server(opts, out)
    policy = gateway_policy(system)
    if policy is not None:
        return start_sglang_gateway(opts, out, policy)
    raise ValueError(f"unknown system {system!r}: one of {SYSTEMS}")

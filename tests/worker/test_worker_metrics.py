"""A replica's /metrics over real HTTP: the engine metrics (KV bytes and pages, the encoder's launches and
latency, headroom, the kernels in use) with values that follow what the engine does; per-request series."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from worker_helpers import collect

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.metrics import WorkerMetrics
from zipkv.worker.runtime import WorkerRuntime
from zipkv.worker.settings import WorkerSettings

ENGINE_METRICS = (
    "zipkv_worker_kv_budget_bytes", "zipkv_worker_kv_stored_bytes", "zipkv_worker_kv_raw_bytes",
    "zipkv_worker_kv_pages", "zipkv_worker_encode_launches_total", "zipkv_worker_encode_pages_total",
    "zipkv_worker_encode_ms_bucket", "zipkv_worker_headroom_tokens", "zipkv_worker_compression_ratio",
    "zipkv_worker_kernel_info", "zipkv_worker_running_requests",
)  # fmt: skip


@pytest.fixture
def runtime() -> Iterator[WorkerRuntime]:
    settings = WorkerSettings(metrics_port=0)
    rt = WorkerRuntime(build_engine(settings), settings, worker_id="w-metrics")
    rt.start()
    yield rt
    rt.stop()


def scrape(rt: WorkerRuntime) -> str:
    with urllib.request.urlopen(f"http://{rt.metrics_address}/metrics", timeout=5) as r:
        return str(r.read().decode())


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name{...labels...}` (with worker w-metrics) from the exposition text."""
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if got.get("worker") == "w-metrics" and all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"{name}{labels} not in /metrics")


def gen(rid: str, prompt_tokens: int, n: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        model="zipkv-tiny",
        prompt_token_ids=[256] + [104] * (prompt_tokens - 1),
        sampling=pb.SamplingParams(max_new_tokens=n, ignore_eos=True),
    )


def test_replica_metrics_list_the_engine_metrics_and_follow_the_engine(runtime: WorkerRuntime) -> None:
    idle = scrape(runtime)
    for name in ENGINE_METRICS:
        assert re.search(rf"^{name}\{{", idle, re.MULTILINE), f"{name} missing from /metrics"
    assert value(idle, "zipkv_worker_kv_stored_bytes") == 0
    assert value(idle, "zipkv_worker_encode_launches_total") == 0
    assert value(idle, "zipkv_worker_kernel_info", decode="torch_reference", page_format="v2") == 1
    budget = value(idle, "zipkv_worker_kv_budget_bytes")
    assert 0 < budget <= 64 << 20

    # A long request (100 prompt tokens: 6 full pages at once, then one more every 16 tokens): while it
    # runs, its full pages are stored compressed, in fewer bytes than raw.
    done = threading.Event()
    result: list[object] = []

    def run() -> None:
        async def main() -> None:
            async with grpc.aio.insecure_channel(runtime.address) as ch:
                result.append(await collect(pb_grpc.WorkerStub(ch), gen("long", 100, 600)))

        asyncio.run(main())
        done.set()

    threading.Thread(target=run, daemon=True).start()
    deadline = time.monotonic() + 60
    while True:
        text = scrape(runtime)
        if value(text, "zipkv_worker_kv_pages", state="compressed") >= 6:
            break
        assert not done.is_set() and time.monotonic() < deadline, "no compressed page seen while it ran"
        time.sleep(0.05)
    stored, raw = value(text, "zipkv_worker_kv_stored_bytes"), value(text, "zipkv_worker_kv_raw_bytes")
    assert 0 < stored < raw, (stored, raw)
    assert value(text, "zipkv_worker_running_requests") == 1
    assert value(text, "zipkv_worker_headroom_tokens") < value(idle, "zipkv_worker_headroom_tokens")
    assert done.wait(120)

    time.sleep(0.4)  # the next KV snapshot (every 0.25 s on the engine thread)
    after = scrape(runtime)
    launches = value(after, "zipkv_worker_encode_launches_total")
    pages = value(after, "zipkv_worker_encode_pages_total")
    # 700 tokens fill 43 pages; the prefill's 6 pages go in one launch, then one page per launch.
    assert pages >= 43 and 1 <= launches <= pages
    assert value(after, "zipkv_worker_encode_ms_count") == launches  # CPU: every launch measured
    assert value(after, "zipkv_worker_encode_ms_bucket", le="+Inf") == launches
    assert value(after, "zipkv_worker_kv_stored_bytes") == 0  # its pages were freed
    assert value(after, "zipkv_worker_requests_total", finish="length") == 1
    assert value(after, "zipkv_worker_generated_tokens_total") == 600
    assert value(after, "zipkv_worker_prefill_tokens_total") == 100
    assert value(after, "zipkv_worker_ttft_ms_count") == 1


def test_replicas_sharing_a_pod_take_the_next_free_port() -> None:
    metrics = [WorkerMetrics(f"w{i}", "m", lambda: None, lambda: None) for i in range(3)]  # type: ignore[arg-type,return-value]
    try:
        first = metrics[0].serve("127.0.0.1", 0, 1)
        ports = [first] + [m.serve("127.0.0.1", first, 2) for m in metrics[1:]]
        # w1 finds `first` taken and takes first + 1 (or any free one if that is taken too); w2 finds
        # the whole range taken and falls back to a free port outside it.
        assert len(set(ports)) == 3 and ports[2] not in (first, first + 1)
    finally:
        for m in metrics:
            m.stop()

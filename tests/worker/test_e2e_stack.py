"""End to end on the CPU: the official openai client -> router(s) -> Ray Serve replicas -> tokens back.

One local stack for the whole module (Ray starts once): two routers sharing a real Redis, two worker
replicas of the tiny model. Covers streaming, spreading by headroom, a replica killed mid-stream (a clear
error, Serve restarts it, the router stops placing on the dead one), and `zipkv status`.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from servers import free_port, free_port_run, start_redis

from zipkv.stack import cli
from zipkv.stack.local_http import http_get
from zipkv.stack.local_observability import ray_logs_dir, worker_metrics_urls
from zipkv.stack.local_stack import LocalStack
from zipkv.stack.options import StackOptions

pytestmark = pytest.mark.slow
MODEL = "zipkv-tiny"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = start_redis(tmp_path_factory.mktemp("redis"), port)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def stack(redis_url: str) -> Iterator[LocalStack]:
    options = StackOptions(
        port=free_port_run(2),
        workers=2,
        routers=2,
        redis_url=redis_url,
        kv_budget_mib=16,
        metrics_port=free_port(),
    )
    local = LocalStack(options, progress=lambda line: print(line, flush=True))
    try:
        local.start(ready_timeout_s=180)
    except BaseException:
        print(local.router_log(0)[-4000:])
        local.stop()
        raise
    yield local
    local.stop()


def client(stack: LocalStack, k: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_urls[k]}/v1", api_key="unused", max_retries=0, timeout=60)


def placements(stack: LocalStack, k: int = 0) -> dict[str, float]:
    """zipkv_router_placements_total by worker, from router k's Prometheus metrics."""
    code, body = http_get(f"{stack.base_urls[k]}/metrics")
    assert code == 200
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r"zipkv_router_placements_total\{(.*)\} ([0-9.e+]+)", line)
        if m:
            worker = re.search(r'worker="([^"]+)"', m.group(1))
            assert worker is not None
            out[worker.group(1)] = out.get(worker.group(1), 0.0) + float(m.group(2))
    return out


def headroom_workers(stack: LocalStack, k: int = 0) -> set[str]:
    """Workers router k currently knows (its per-worker headroom gauge)."""
    _, body = http_get(f"{stack.base_urls[k]}/metrics")
    return set(re.findall(r'zipkv_router_worker_headroom_tokens\{[^}]*worker="([^"]+)"', body.decode()))


def test_openai_client_streams_tokens_through_both_routers(stack: LocalStack) -> None:
    for k in (0, 1):
        stream = client(stack, k).completions.create(
            model=MODEL, prompt="zipkv says hello", max_tokens=24, stream=True, temperature=0
        )
        chunks = list(stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert len(chunks) >= 3 and text
        assert chunks[-1].choices[0].finish_reason == "length" or any(
            c.choices and c.choices[0].finish_reason == "length" for c in chunks
        )
    chat = client(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    # Greedy through the whole stack is deterministic, whichever replica serves it.
    again = [
        client(stack, k).completions.create(model=MODEL, prompt="same prompt", max_tokens=16, temperature=0)
        for k in (0, 1, 0)
    ]
    assert len({r.choices[0].text for r in again}) == 1


def test_concurrent_requests_spread_by_headroom(stack: LocalStack) -> None:
    before = placements(stack, 0)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            stream = client(stack, 0).completions.create(
                model=MODEL, prompt=f"request {i} " * 20, max_tokens=150, stream=True, temperature=0
            )
            for _ in stream:
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(120)
    assert not errors, errors
    after = placements(stack, 0)
    delta = {w: after.get(w, 0) - before.get(w, 0) for w in after}
    served = [w for w, n in delta.items() if n > 0]
    # Headroom drops on the worker that took a request, so the next goes to the other one.
    assert len(served) == 2, delta
    assert min(delta[w] for w in served) >= 2, delta


def test_each_replica_serves_its_engine_metrics(stack: LocalStack) -> None:
    """Each Ray Serve replica's /metrics, under the worker id the router places on."""
    urls = worker_metrics_urls(stack.options.metrics_port, stack.options.workers)
    assert set(urls) == {w["worker_id"] for w in stack.workers()}, urls
    assert set(urls) <= set(placements(stack, 0)) | headroom_workers(stack, 0)
    for worker, url in urls.items():
        code, body = http_get(url)
        text = body.decode()
        assert code == 200
        for name in ("zipkv_worker_kv_stored_bytes", "zipkv_worker_kv_pages", "zipkv_worker_encode_ms_bucket",
                     "zipkv_worker_headroom_tokens", "zipkv_worker_kernel_info"):  # fmt: skip
            assert re.search(rf'^{name}{{[^}}]*worker="{worker}"', text, re.MULTILINE), (name, text[:2000])
        # the replica's own log lines are in its Serve log, with where its metrics are
        logs = "".join(p.read_text() for p in (ray_logs_dir() / "serve").glob("replica_*.log"))
        assert re.search(rf"worker ready worker_id={worker} .* metrics={url}", logs), logs[-3000:]
        # this module's earlier requests ran here: their pages were encoded
        launches = re.search(r"^zipkv_worker_encode_launches_total{[^}]*} (\S+)$", text, re.MULTILINE)
        assert launches and float(launches.group(1)) > 0, text[:2000]


def test_replica_killed_mid_stream(stack: LocalStack) -> None:
    before_ids = {w["worker_id"] for w in stack.workers()}
    assert len(before_ids) == 2
    victim = kill_the_streaming_replica(stack)
    _, body = http_get(f"{stack.base_urls[0]}/metrics")
    assert 'zipkv_router_retries_total{reason="lost_mid_request"} 1.0' in body.decode()

    # Requests right after the kill still succeed: a placement on the dead replica fails before any
    # token and is retried on the other one.
    for i in range(4):
        r = client(stack, 0).completions.create(model=MODEL, prompt=f"after {i}", max_tokens=4, temperature=0)
        assert r.choices[0].text is not None
    # Once its reports stop for expire_after_ms, the router drops it and places nothing more there.
    end = time.monotonic() + 30
    while time.monotonic() < end and victim in headroom_workers(stack, 0):
        time.sleep(0.2)
    assert victim not in headroom_workers(stack, 0)
    dead_before = placements(stack, 0).get(victim, 0.0)
    for i in range(4):
        r = client(stack, 0).completions.create(model=MODEL, prompt=f"later {i}", max_tokens=4, temperature=0)
        assert r.choices[0].text is not None
    assert placements(stack, 0).get(victim, 0.0) == dead_before

    # Ray Serve brings a new replica up; it reports under a new id and gets placements again.
    replacement = wait_for_replacement(stack, victim, before_ids)
    end = time.monotonic() + 30
    while time.monotonic() < end and placements(stack, 0).get(replacement, 0.0) == 0:
        spread_requests(stack, 4)
    assert placements(stack, 0).get(replacement, 0.0) > 0


def kill_the_streaming_replica(stack: LocalStack) -> str:
    """Streams a long answer and, at its third chunk, kills the replica serving it; the stream must go on
    to its end on the survivor. Returns the killed worker's id."""
    import ray

    placed_before = placements(stack, 0)
    stream = client(stack, 0).completions.create(
        model=MODEL, prompt="a long answer please", max_tokens=300, stream=True, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    received, text, victim = 0, "", ""
    for chunk in stream:  # the kill does not end it: the stream goes on from its tokens on the survivor
        received += 1
        text += chunk.choices[0].text if chunk.choices else ""
        if received == 3:
            placed = placements(stack, 0)
            (victim,) = [w for w in placed if placed[w] > placed_before.get(w, 0.0)]
            assert victim in headroom_workers(stack, 0)  # known to the router before the kill
            tag = victim.removeprefix("zipkv-worker-")
            actor = ray.get_actor(f"SERVE_REPLICA::zipkv#zipkv-worker#{tag}", namespace="serve")
            ray.kill(actor, no_restart=True)
    assert received > 3 and text and chunk.choices[0].finish_reason == "length"
    print("client saw", received, "chunks, the stream resumed on the survivor after the kill")
    return victim


def wait_for_replacement(stack: LocalStack, victim: str, before_ids: set[str], timeout_s: float = 120) -> str:
    """The id of the replica Ray Serve started in the killed one's place, once two report again."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ids = {w["worker_id"] for w in stack.workers()}
        if len(ids) == 2 and victim not in ids:
            break
        time.sleep(0.5)
    ids = {w["worker_id"] for w in stack.workers()}
    assert len(ids) == 2 and victim not in ids, ids
    (replacement,) = ids - before_ids
    return str(replacement)


def spread_requests(stack: LocalStack, count: int) -> None:
    """`count` requests at once, so the router has to place some on the less loaded replica."""
    threads = [
        threading.Thread(
            target=lambda: client(stack, 0).completions.create(
                model=MODEL, prompt="spread me", max_tokens=60, temperature=0
            )
        )
        for _ in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_zipkv_status_shows_workers(stack: LocalStack) -> None:
    # A replica killed earlier in this module may still show, marked stale, until it ages out; a live one
    # can show stale for a moment on a loaded 2-core machine (a late report), so look again for a while.
    end = time.monotonic() + 20
    while True:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(["status", "--port", str(stack.options.port)])
        text = out.getvalue()
        assert rc == 0, text
        assert "router" in text and ": up;" in text
        rows = [line for line in text.splitlines() if line.startswith("zipkv-worker-") and " ok " in line]
        if len(rows) == 2 or time.monotonic() > end:
            break
        time.sleep(1.0)
    assert len(rows) == 2, text
    for row in rows:
        assert " ok " in row and "run /" in row and re.search(r"\d+(\.\d)?k? \(\d+%\)", row), row


def test_status_without_a_stack(tmp_path: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["status", "--port", str(free_port())])
    assert rc == 1 and "zipkv up" in out.getvalue()

"""The worker runtime over real gRPC on loopback: Generate/Abort/Health, capacity reports, drain."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from worker_helpers import RecordingControlPlane, collect

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.runtime import WorkerRuntime
from zipkv.worker.settings import WorkerSettings

Worker = tuple[WorkerRuntime, RecordingControlPlane]


@pytest.fixture
def worker(
    control_plane: tuple[str, RecordingControlPlane],
) -> Iterator[tuple[WorkerRuntime, RecordingControlPlane]]:
    address, recorder = control_plane
    settings = WorkerSettings(router_address=address, report_token="s3cret", report_interval_ms=100)
    runtime = WorkerRuntime(build_engine(settings), settings, worker_id="w-test")
    runtime.start()
    yield runtime, recorder
    runtime.stop()


def gen(rid: str, n: int, prompt: tuple[int, ...] = (256, 104, 105)) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        model="zipkv-tiny",
        prompt_token_ids=list(prompt),
        sampling=pb.SamplingParams(max_new_tokens=n, ignore_eos=True),
    )


def test_generate_streams_tokens_and_reports_flow(
    worker: Worker,
) -> None:
    runtime, recorder = worker

    async def main() -> tuple[list[int], pb.Finish, pb.HealthResponse, list[int], pb.Finish]:
        async with grpc.aio.insecure_channel(runtime.address) as ch:
            stub = pb_grpc.WorkerStub(ch)
            health = await stub.Health(pb.HealthRequest())
            tokens, finish = await collect(stub, gen("a", 20))
            again, finish2 = await collect(stub, gen("b", 20))
            return tokens, finish, health, again, finish2

    tokens, finish, health, again, _ = asyncio.run(main())
    assert len(tokens) == 20 and tokens == again  # greedy: same prompt, same tokens
    assert finish.reason == pb.FINISH_REASON_LENGTH and finish.usage.completion_tokens == 20
    assert finish.usage.prompt_tokens == 3 and finish.ttft_ms > 0
    assert (
        health.serving
        and not health.draining
        and health.worker_id == "w-test"
        and health.model == "zipkv-tiny"
    )
    time.sleep(0.35)
    with recorder.lock:
        reports = list(recorder.reports)
    assert len(reports) >= 3 and recorder.refused == 0
    seqs = [r.sequence for r in reports]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    last = reports[-1]
    assert last.worker_id == "w-test" and last.address == runtime.address and last.model == "zipkv-tiny"
    assert (
        last.headroom_tokens > 0
        and last.total_tokens >= last.headroom_tokens
        and last.kv_bytes_per_token == 1024
    )
    assert last.max_context_tokens == 2048 and not last.draining and last.epoch > 0


def test_reports_need_the_token(control_plane: tuple[str, RecordingControlPlane]) -> None:
    address, recorder = control_plane
    settings = WorkerSettings(router_address=address, report_token="wrong", report_interval_ms=100)
    runtime = WorkerRuntime(build_engine(settings), settings)
    runtime.start()
    try:
        time.sleep(0.3)
    finally:
        runtime.stop()
    assert recorder.refused >= 2 and not recorder.reports
    assert runtime.reporters[0].accepted == 0 and runtime.reporters[0].sent >= 2


def test_abort_cancel_and_bad_requests(worker: Worker) -> None:
    runtime, _ = worker

    async def main() -> None:
        async with grpc.aio.insecure_channel(runtime.address) as ch:
            stub = pb_grpc.WorkerStub(ch)
            # Abort by the router, mid-stream.
            call = stub.Generate(gen("long", 1500))
            first = await call.read()
            assert first.HasField("chunk")
            assert (await stub.Abort(pb.AbortRequest(request_id="long"))).found
            last = first
            while (msg := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                last = msg
            assert last.HasField("finish") and last.finish.reason == pb.FINISH_REASON_ABORT
            assert "router" in last.finish.message
            assert not (await stub.Abort(pb.AbortRequest(request_id="long"))).found
            # A caller that goes away frees its request.
            call = stub.Generate(gen("gone", 1500))
            await call.read()
            call.cancel()
            for _ in range(100):
                if not runtime.engine.has_work():
                    break
                await asyncio.sleep(0.02)
            assert not runtime.engine.has_work()
            # Bad input: a clear status, nothing started.
            for request, code, text in (
                (gen("", 4), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
                (gen("e", 4, prompt=()), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
                (gen("v", 4, prompt=(5000,)), grpc.StatusCode.INVALID_ARGUMENT, "vocabulary"),
                (
                    pb.GenerateRequest(request_id="m", model="other", prompt_token_ids=[1]),
                    grpc.StatusCode.NOT_FOUND,
                    "other",
                ),
                (gen("big", 4, prompt=(7,) * 2048), grpc.StatusCode.INVALID_ARGUMENT, "context"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await collect(stub, request)
                assert err.value.code() == code and text in (err.value.details() or ""), request

    asyncio.run(main())
    assert runtime.engine.capacity().committed_tokens == 0


def test_drain_refuses_new_work_and_finishes_or_aborts_running(
    worker: Worker,
) -> None:
    runtime, recorder = worker
    results: dict[str, Any] = {}

    async def client() -> None:
        async with grpc.aio.insecure_channel(runtime.address) as ch:
            stub = pb_grpc.WorkerStub(ch)
            short = asyncio.create_task(collect(stub, gen("short", 30)))
            long = asyncio.create_task(collect(stub, gen("long", 1900)))
            await asyncio.sleep(0.3)
            results["draining_started"] = True
            threading.Thread(
                target=lambda: results.setdefault("aborted", runtime.drain(timeout_s=1.5))
            ).start()
            await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(stub, gen("late", 4))
            results["late"] = err.value.code()
            results["short"] = await short
            results["long"] = await long

    asyncio.run(client())
    for _ in range(100):
        if "aborted" in results:
            break
        time.sleep(0.05)
    assert results["late"] == grpc.StatusCode.UNAVAILABLE
    short_tokens, short_finish = results["short"]
    assert len(short_tokens) == 30 and short_finish.reason == pb.FINISH_REASON_LENGTH
    long_tokens, long_finish = results["long"]
    assert long_finish.reason == pb.FINISH_REASON_ABORT and "shutting down" in long_finish.message
    assert 0 < len(long_tokens) < 1900
    assert results["aborted"] == 1
    with recorder.lock:
        assert any(r.draining for r in recorder.reports)
    assert not runtime.healthy()

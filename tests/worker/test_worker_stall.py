"""A hung engine (a GPU kernel or a collective that never completes): the engine thread stays alive and
every stream goes silent. Past `engine_stall_s` with requests in the engine and no token, the replica is
unhealthy (Ray Serve's health check replaces it), reports draining (routers stop placing on it), refuses
Generate and fails the calls it holds with UNAVAILABLE (the router retries or resumes them elsewhere); a
token in time changes nothing.

Two shapes of hang: a step that blocks (the reference engine on CPU over real gRPC, its model pass held by
the test, HeldForward) and steps that keep returning nothing (as SGLang's do when its scheduler process
hangs: a scripted engine, a stand-in for it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import generate_latest
from test_capacity_in_prefill import HeldForward
from test_worker_grpc import gen
from worker_helpers import RecordingControlPlane

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import EngineEvent
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.loop import EngineLoop, wait_until
from zipkv.worker.runtime import WorkerRuntime
from zipkv.worker.serve import settings_from_args
from zipkv.worker.settings import WorkerSettings

STALL_S = 0.6


@pytest.fixture
def held_worker(
    control_plane: tuple[str, RecordingControlPlane],
) -> Iterator[tuple[WorkerRuntime, RecordingControlPlane, HeldForward]]:
    address, recorder = control_plane
    settings = WorkerSettings(
        router_address=address, report_token="s3cret", report_interval_ms=100, engine_stall_s=STALL_S
    )
    runtime = WorkerRuntime(build_engine(settings), settings, worker_id="w-stall")
    held = HeldForward(runtime.engine)  # type: ignore[arg-type]
    runtime.start()
    yield runtime, recorder, held
    held.release.set()
    runtime.stop()


async def generate(address: str, rid: str, timeout_s: float = 2.0) -> grpc.StatusCode | None:
    """Open a Generate and read its first message: None if it answered, else the error code."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = pb_grpc.WorkerStub(ch).Generate(gen(rid, 2), timeout=timeout_s)
        try:
            await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        call.cancel()
        return None


def silent_seconds(runtime: WorkerRuntime) -> float:
    """The replica's zipkv_worker_silent_seconds, as its /metrics would show it."""
    text = generate_latest(runtime.metrics.registry).decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("zipkv_worker_silent_seconds{")]
    return float(line.split()[-1])


def last_report(recorder: RecordingControlPlane) -> pb.CapacityReport:
    time.sleep(0.3)  # at least two report intervals
    with recorder.lock:
        return recorder.reports[-1]


def test_a_step_past_the_limit_makes_the_replica_unhealthy_until_it_ends(
    held_worker: tuple[WorkerRuntime, RecordingControlPlane, HeldForward],
) -> None:
    runtime, recorder, held = held_worker
    first: list[grpc.StatusCode | None] = []
    client = threading.Thread(target=lambda: first.append(asyncio.run(generate(runtime.address, "a", 20.0))))
    client.start()
    assert wait_until(lambda: held.passes == 1, 10)  # its prefill entered the model pass, held there
    assert runtime.healthy() and not last_report(recorder).draining  # younger than engine_stall_s
    time.sleep(STALL_S)
    assert not runtime.healthy()
    assert "engine stuck: no token for" in runtime.engine_loop.trouble()
    assert silent_seconds(runtime) > STALL_S  # what an operator's alert reads
    assert last_report(recorder).draining  # routers stop placing here
    assert asyncio.run(generate(runtime.address, "next")) == grpc.StatusCode.UNAVAILABLE
    # The held request's call fails too, at once, so that its router moves it to another worker now.
    client.join(5)
    assert first == [grpc.StatusCode.UNAVAILABLE]
    runtime.engine._forward = held._inner  # type: ignore[attr-defined]  # later passes run free
    held.release.set()  # the step ends after all (a slow step, not a dead one): healthy again
    assert wait_until(runtime.healthy, 5)
    assert not last_report(recorder).draining
    assert wait_until(lambda: silent_seconds(runtime) == 0.0, 5)  # the failed request aborted: idle
    assert asyncio.run(generate(runtime.address, "after")) is None  # serving again


def test_engine_stall_s_is_validated_and_reaches_the_replica() -> None:
    with pytest.raises(ValueError, match="engine_stall_s"):
        WorkerSettings(engine_stall_s=-1.0)
    settings, *_ = settings_from_args({"engine_stall_s": "45"})
    assert settings.engine_stall_s == 45.0
    assert settings_from_args({})[0].engine_stall_s == 300.0


class SilentEngine:
    """A stand-in for SGLang's engine wrapper whose scheduler hangs: it holds work, and every step returns
    no event, quickly, until the test lets one through."""

    model_name = "silent"

    def __init__(self) -> None:
        self.work, self.emit = False, threading.Event()

    def capacity(self) -> Capacity:
        return Capacity(
            headroom_tokens=0, committed_tokens=0, total_tokens=1, compression_ratio=1.0, running_requests=0,
            queued_requests=0, queued_prefill_tokens=0, ttft_ms=0.0, itl_ms=0.0, max_context_tokens=0,
            kv_bytes_per_token=0,
        )  # fmt: skip

    def kv_stats(self) -> None:
        return None

    def has_work(self) -> bool:
        return self.work

    def step(self, on_scheduled: object = None) -> list[EngineEvent]:
        time.sleep(0.01)
        if self.emit.is_set():
            self.emit.clear()
            return [EngineEvent("r", token_ids=(1,))]
        return []


def test_steps_that_return_nothing_while_requests_wait_are_a_stall_and_idle_is_not() -> None:
    engine = SilentEngine()
    io_loop = asyncio.new_event_loop()
    loop = EngineLoop(engine, io_loop, stall_after_s=STALL_S)  # type: ignore[arg-type]
    loop.start()
    try:
        time.sleep(STALL_S * 2)
        assert loop.alive  # nothing to do is not a stall
        engine.work = True
        time.sleep(STALL_S / 2)
        assert loop.alive
        assert wait_until(lambda: not loop.alive, 5)
        assert loop.stalled_s() > STALL_S and "no token" in loop.trouble()
        engine.emit.set()  # a token: progress
        assert wait_until(lambda: loop.alive, 5)
    finally:
        loop.stop()
        io_loop.close()

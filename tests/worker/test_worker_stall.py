"""A stuck engine step (a GPU hang, a collective that never completes): the engine thread stays alive and
every stream goes silent, so only the step's age tells. Past `step_stall_s` the replica is unhealthy (Ray
Serve's health check replaces it), reports draining (routers stop placing on it) and refuses Generate with
UNAVAILABLE (the router retries elsewhere); a step that ends in time changes nothing.

The reference engine on CPU over real gRPC, its model pass held by the test (HeldForward).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from test_capacity_in_prefill import HeldForward
from test_worker_grpc import gen
from worker_helpers import RecordingControlPlane

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.loop import wait_until
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
        router_address=address, report_token="s3cret", report_interval_ms=100, step_stall_s=STALL_S
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
    assert runtime.healthy() and not last_report(recorder).draining  # younger than step_stall_s
    time.sleep(STALL_S)
    assert not runtime.healthy()
    assert "engine step stuck" in runtime.engine_loop.trouble()
    assert last_report(recorder).draining  # routers stop placing here
    assert asyncio.run(generate(runtime.address, "next")) == grpc.StatusCode.UNAVAILABLE
    runtime.engine._forward = held._inner  # type: ignore[attr-defined]  # later passes run free
    held.release.set()  # the step ends after all (a slow step, not a dead one): healthy again
    assert wait_until(runtime.healthy, 5)
    assert not last_report(recorder).draining
    client.join(10)
    assert first == [None]  # the held request got its first token once the step ended


def test_step_stall_s_is_validated_and_reaches_the_replica() -> None:
    with pytest.raises(ValueError, match="step_stall_s"):
        WorkerSettings(step_stall_s=-1.0)
    settings, *_ = settings_from_args({"step_stall_s": "45"})
    assert settings.step_stall_s == 45.0
    assert settings_from_args({})[0].step_stall_s == 300.0

"""The capacity reporter: sends this worker's live, compression-aware capacity to the router.

Every `interval_ms` (100-250 ms) it converts the engine's capacity (already in tokens) into a
`CapacityReport` and calls `ControlPlane.ReportCapacity` with `authorization: Bearer <token>` metadata.
`sequence` increases strictly; `epoch` is this process's start time, so a restarted replica's reports
order after the old one's. A failed report is logged (once per outage) and retried at the next tick:
the router expires workers whose reports stop, which is the intended behaviour when it is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from zipkv.controlplane.grpc_auth import TlsFiles, open_channel
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.protos.capacity import Capacity

log = logging.getLogger("zipkv.worker")


class CapacityReporter:
    def __init__(
        self,
        router_address: str,
        token: str,
        worker_id: str,
        address: str,
        model: str,
        capacity: Callable[[], Capacity],
        draining: Callable[[], bool],
        interval_ms: int = 200,
        tls: TlsFiles | None = None,
        epoch: int | None = None,
    ) -> None:
        if not 50 <= interval_ms <= 1000:
            raise ValueError(f"report interval_ms must be within 50..1000, got {interval_ms}")
        self.router_address = router_address
        self.worker_id = worker_id
        self.address = address
        self.model = model
        self._capacity = capacity
        self._draining = draining
        self._interval_s = interval_ms / 1000.0
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # One epoch per worker process, shared by its reporters: routers sharing Redis then see the
        # same (epoch, sequence) from each reporter as one report, not as out of order.
        self.epoch = epoch if epoch is not None else time.time_ns()
        self.sequence = 0
        self.sent = 0
        self.accepted = 0
        self._failing = False
        self._channel = open_channel(router_address, tls)
        self._stub = pb_grpc.ControlPlaneStub(self._channel)
        self._task: asyncio.Task[None] | None = None

    def build(self) -> pb.CapacityReport:
        cap = self._capacity()
        self.sequence += 1
        return pb.CapacityReport(
            worker_id=self.worker_id,
            address=self.address,
            model=self.model,
            sequence=self.sequence,
            epoch=self.epoch,
            timestamp_s=time.time(),
            draining=self._draining(),
            **cap.report_fields(),
        )

    async def report_once(self) -> bool:
        report = self.build()
        self.sent += 1
        try:
            ack = await self._stub.ReportCapacity(report, metadata=self._metadata, timeout=1.0)
        except grpc.aio.AioRpcError as exc:
            if not self._failing:
                log.warning(
                    "capacity report failed router=%s code=%s detail=%s (retrying every %.0f ms)",
                    self.router_address,
                    exc.code().name,
                    exc.details(),
                    self._interval_s * 1000,
                )
            self._failing = True
            return False
        if self._failing:
            log.info("capacity reports reach the router again router=%s", self.router_address)
        self._failing = False
        if not ack.accepted:
            log.warning("capacity report refused seq=%d reason=%s", report.sequence, ack.reason)
            return False
        self.accepted += 1
        return True

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await self.report_once()
            await asyncio.sleep(max(0.0, self._interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="zipkv-reporter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._channel.close(grace=None)

"""gRPC `ControlPlane.ReportCapacity`: authenticated, validated, ordered capacity reports."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

import grpc

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.state import Store, check_report, view_from_report
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc

log = logging.getLogger("zipkv.controlplane.reports")


def _bearer(metadata: object) -> str:
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            return text[7:] if text.startswith("Bearer ") else ""
    return ""


class ReportServicer(pb_grpc.ControlPlaneServicer):
    def __init__(
        self,
        cfg: RouterConfig,
        store: Store,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._token = cfg.security.report_token

    async def ReportCapacity(
        self, request: pb.CapacityReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportAck:
        if self._token and not hmac.compare_digest(_bearer(context.invocation_metadata()), self._token):
            self._metrics.reports.labels("unauthenticated").inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "report token missing or wrong")
        now = self._clock()
        problem = check_report(request, now, self._cfg.placement.stale_after_ms)
        if problem is not None:
            outcome = "late" if problem.startswith("late") else "invalid"
            self._metrics.reports.labels(outcome).inc()
            return pb.ReportAck(accepted=False, reason=problem)
        refused = await self._store.put_report(view_from_report(request, now))
        if refused is not None:
            self._metrics.reports.labels("out_of_order").inc()
            return pb.ReportAck(accepted=False, reason=refused)
        self._metrics.reports.labels("accepted").inc()
        return pb.ReportAck(accepted=True)


async def start_report_server(servicer: ReportServicer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the ControlPlane gRPC server; returns it and the bound port (port 0 picks one)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 20)])
    pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"cannot bind the report port {host}:{port}: is another process using it?")
    await server.start()
    return server, bound

"""gRPC `ControlPlane.ReportCapacity`: authenticated, validated, ordered capacity reports."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.grpc_auth import (
    EXCLUSIVE_PORT,
    TlsFiles,
    add_port,
    bearer_token,
    peer_identity,
    tokens_equal,
    warn_plaintext,
)
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.report_checks import check_report
from zipkv.controlplane.state import Store, view_from_report
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc

log = logging.getLogger("zipkv.controlplane.reports")


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
        self._models = frozenset(m.name for m in cfg.models)

    def _identity(self, context: grpc.aio.ServicerContext) -> str | None:
        """Who sent the report: an identity (the client certificate's CN under mutual TLS, or the name
        of a per-worker token) that may report only its own worker ids, "*" (the shared report token or
        explicitly open reports: any worker id), or None (unauthenticated)."""
        sec = self._cfg.security
        if sec.tls is not None:
            return peer_identity(context)
        token = bearer_token(context.invocation_metadata())
        for name, expected in sec.worker_tokens.items():
            if tokens_equal(token, expected):
                return name
        if sec.report_token and tokens_equal(token, sec.report_token):
            return "*"
        return "*" if sec.reports_open() and sec.allow_unauthenticated_reports else None

    async def ReportCapacity(
        self, request: pb.CapacityReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportAck:
        identity = self._identity(context)
        if identity is None:
            self._metrics.reports.labels("unauthenticated").inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "report credentials missing or wrong")
        assert identity is not None
        wid = request.worker_id
        if identity != "*" and wid != identity and not wid.startswith(identity + "/"):
            self._metrics.reports.labels("forbidden").inc()
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"credentials of {identity!r} may report worker ids {identity!r} or {identity + '/...'!r} "
                f"only, not {wid[:140]!r}",
            )
        now = self._clock()
        problem = check_report(request, now, self._cfg.placement.stale_after_ms, self._models)
        if problem is not None:
            self._metrics.reports.labels(problem.outcome).inc()
            self._metrics.report_rejections.labels(problem.field).inc()
            log.warning(
                "capacity report refused",
                extra={"worker": wid[:140], "field": problem.field, "reason": problem.message},
            )
            return pb.ReportAck(accepted=False, reason=problem.message)
        refused = await self._store.put_report(view_from_report(request, now))
        if refused is not None:
            self._metrics.reports.labels("out_of_order").inc()
            return pb.ReportAck(accepted=False, reason=refused)
        self._metrics.reports.labels("accepted").inc()
        return pb.ReportAck(accepted=True)


async def start_report_server(
    servicer: ReportServicer, host: str, port: int, tls: TlsFiles | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the ControlPlane gRPC server (mutual TLS when `tls` is given); returns it and the bound
    port (port 0 picks one)."""
    server = grpc.aio.server(options=[EXCLUSIVE_PORT, ("grpc.max_receive_message_length", 1 << 20)])
    pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)
    if tls is None:
        warn_plaintext(f"router report server on {host}:{port}")
    try:
        bound = add_port(server, f"{host}:{port}", tls)
    except RuntimeError:  # gRPC's own message names no cause
        bound = 0
    if bound == 0:
        raise RuntimeError(f"cannot bind the report port {host}:{port}: is another process using it?")
    await server.start()
    return server, bound

"""A local status tap: a ControlPlane gRPC endpoint that keeps each worker's latest CapacityReport.

`zipkv up` runs one beside the router; every worker reports to both (the same message), and the tap
writes the latest reports to a JSON file that `zipkv status` reads. It never affects placement.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from zipkv.controlplane.grpc_auth import EXCLUSIVE_PORT
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc


class StatusTap(pb_grpc.ControlPlaneServicer):
    def __init__(
        self, token: str, path: Path, write_every_s: float = 0.5, forget_after_s: float = 60.0
    ) -> None:
        self._token = token
        self.forget_after_s = forget_after_s
        self.path = path
        self._latest: dict[str, tuple[float, pb.CapacityReport]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._write_every_s = write_every_s
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE_PORT])
        pb_grpc.add_ControlPlaneServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._writer = threading.Thread(target=self._write_loop, name="zipkv-status-tap", daemon=True)

    def ReportCapacity(self, request: pb.CapacityReport, context: grpc.ServicerContext) -> pb.ReportAck:
        if dict(context.invocation_metadata()).get("authorization", "") != f"Bearer {self._token}":
            return pb.ReportAck(accepted=False, reason="unauthenticated")
        with self._lock:
            self._latest[request.worker_id] = (time.time(), request)
        return pb.ReportAck(accepted=True)

    def start(self) -> str:
        self._server.start()
        self._writer.start()
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(grace=None)
        self._writer.join(2.0)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            now = time.time()  # a worker silent this long is gone (a replaced replica reports anew)
            for worker_id in [w for w, (seen, _) in self._latest.items() if now - seen > self.forget_after_s]:
                del self._latest[worker_id]
            items = list(self._latest.values())
        out = []
        for received_s, report in items:
            row = MessageToDict(
                report, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
            row["received_s"] = received_s
            out.append(row)
        return sorted(out, key=lambda r: r["worker_id"])

    def _write_loop(self) -> None:
        while not self._stop.wait(self._write_every_s):
            self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"written_s": time.time(), "workers": self.snapshot()}))
        tmp.replace(self.path)

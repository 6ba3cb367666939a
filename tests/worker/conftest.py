"""Worker-test fixtures: a real ControlPlane gRPC server on loopback that records reports."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from worker_helpers import RecordingControlPlane

from zipkv.protos import zipkv_pb2_grpc as pb_grpc


@pytest.fixture
def control_plane() -> Iterator[tuple[str, RecordingControlPlane]]:
    servicer = RecordingControlPlane(token="s3cret")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)

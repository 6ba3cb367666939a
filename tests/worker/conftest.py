"""Worker-test fixtures: a real ControlPlane gRPC server on loopback that records reports; ``fmt``, the
page formats the SGLang allocator tests run at (v2, the default, and v3)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from worker_helpers import RecordingControlPlane

from zipkv.kernels.format.layout import PageFormat
from zipkv.protos import zipkv_pb2_grpc as pb_grpc


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def fmt(request: pytest.FixtureRequest) -> PageFormat:
    """A small page format (head_dim 64, one KV head: 4096-byte raw pages) at v2 and at v3."""
    return PageFormat(head_dim=64, num_kv_heads=1, version=request.param)


@pytest.fixture
def control_plane() -> Iterator[tuple[str, RecordingControlPlane]]:
    servicer = RecordingControlPlane(token="s3cret")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)

"""A gRPC server asked for a port that another server holds fails instead of sharing it. gRPC binds with
SO_REUSEPORT by default, which lets both bind and splits the connections between them: another router's
reports would half arrive here, and a test's calls to a stopped worker could reach another one."""

from __future__ import annotations

import asyncio

import pytest

from zipkv.controlplane.reports import start_report_server
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.testing.scripted_worker import ScriptedWorker


def test_a_second_report_server_on_a_taken_port_fails_loudly() -> None:
    async def run() -> None:
        first, port = await start_report_server(pb_grpc.ControlPlaneServicer(), "127.0.0.1", 0)
        try:
            with pytest.raises(RuntimeError, match="is another process using it"):
                await start_report_server(pb_grpc.ControlPlaneServicer(), "127.0.0.1", port)
        finally:
            await first.stop(0)

    asyncio.run(run())


def test_a_scripted_worker_does_not_share_a_taken_port() -> None:
    async def run() -> None:
        first, second = ScriptedWorker(), ScriptedWorker()
        address = await first.start()
        try:
            with pytest.raises(RuntimeError, match="Failed to bind"):
                await second.start(int(address.rsplit(":", 1)[1]))
        finally:
            await first.stop(0)
            await second.stop(0)

    asyncio.run(run())

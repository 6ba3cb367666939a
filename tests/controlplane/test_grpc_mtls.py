"""Mutual TLS on both gRPC hops, with certificates from a test CA: a report is accepted only from a
holder of a certificate the operator's CA signed, and only for worker ids under its common name; the
router dials workers over TLS too. Real gRPC, a real router; scripted workers stand in for GPU workers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from certs import Ca, issue, make_ca
from router_harness import MODEL, LoopThread, Stack, make_config

from zipkv.controlplane.grpc_auth import TlsFiles, open_channel
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.testing.scripted_worker import ScriptedWorker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ca, Path]:
    folder = tmp_path_factory.mktemp("pki")
    return make_ca(folder), folder


@contextlib.contextmanager
def tls_stack(pki: tuple[Ca, Path]) -> Iterator[Stack]:
    ca, folder = pki
    router = issue(ca, "zipkv-router", folder)
    tls = {"cert_file": router.cert_file, "key_file": router.key_file, "ca_file": router.ca_file}
    cfg = make_config(security={"report_token": "", "tls": tls})  # the certificate is the credential
    loop = LoopThread()
    s = Stack(loop, cfg)
    try:
        yield s
    finally:
        s.close()
        loop.close()


async def _report(address: str, report: pb.CapacityReport, tls: TlsFiles | None) -> pb.ReportAck:
    async with open_channel(address, tls) as channel:
        return await pb_grpc.ControlPlaneStub(channel).ReportCapacity(report, timeout=5)


def test_reports_need_a_certificate_from_the_ca_and_are_bound_to_its_name(pki: tuple[Ca, Path]) -> None:
    ca, folder = pki
    worker_cert = issue(ca, "zipkv-worker", folder, peer_name="zipkv-router")
    rogue_ca = make_ca(folder / "rogue", "rogue-ca")
    rogue = issue(rogue_ca, "zipkv-worker", folder / "rogue", peer_name="zipkv-router")
    rogue = TlsFiles(rogue.cert_file, rogue.key_file, worker_cert.ca_file, "zipkv-router")  # trusts us
    with tls_stack(pki) as s:
        w = s.add_worker(report=False, worker_id="zipkv-worker/replica-1")
        address = s.router.report_address
        assert s.loop.run(_report(address, w.report(), worker_cert)).accepted
        other = ScriptedWorker(worker_id="other-worker/replica-1")
        other.address = w.address
        with pytest.raises(grpc.aio.AioRpcError) as err:  # a valid certificate, someone else's id
            s.loop.run(_report(address, other.report(), worker_cert))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        for creds in (rogue, None):  # a certificate from another CA; plaintext
            with pytest.raises(grpc.aio.AioRpcError) as err:
                s.loop.run(_report(address, w.report(), creds))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert [v.worker_id for v in s.router.router.store.snapshot().workers] == ["zipkv-worker/replica-1"]


def test_the_router_dials_workers_over_mutual_tls(pki: tuple[Ca, Path]) -> None:
    ca, folder = pki
    worker_cert = issue(ca, "zipkv-worker", folder, peer_name="zipkv-router")
    with tls_stack(pki) as s:
        w = ScriptedWorker(worker_id="zipkv-worker/replica-2")
        s.loop.run(w.start(tls=worker_cert))
        s.workers.append(w)
        assert s.loop.run(_report(s.router.report_address, w.report(), worker_cert)).accepted
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "hel"

        async def plaintext_generate() -> None:  # the worker's port refuses a client without a certificate
            async with grpc.aio.insecure_channel(w.address) as ch:
                call = pb_grpc.WorkerStub(ch).Generate(pb.GenerateRequest(request_id="x"), timeout=3)
                await call.read()

        with pytest.raises(grpc.aio.AioRpcError) as err:
            s.loop.run(plaintext_generate())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

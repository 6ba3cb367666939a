"""Worker identity on the wire: Generate and Abort only from the router (dispatch token and/or its
certificate), no unauthenticated serving beyond loopback, and the production path (mutual TLS on both
hops, a per-replica worker id under the certificate's name) end to end with the real worker runtime and
a real router."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest
from certs import issue, make_ca
from router_harness import LoopThread, Stack, make_config

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc
from zipkv.worker.engine_factory import build_engine
from zipkv.worker.runtime import WorkerRuntime
from zipkv.worker.settings import WorkerSettings

DISPATCH = "dispatch-token-0123456789abcdef"


def _gen(rid: str) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(max_new_tokens=3, ignore_eos=True)
    return pb.GenerateRequest(
        request_id=rid, model="zipkv-tiny", prompt_token_ids=[256, 104], sampling=sampling
    )


async def _generate(address: str, metadata: tuple[tuple[str, str], ...]) -> list[int]:
    async with grpc.aio.insecure_channel(address) as ch:
        out: list[int] = []
        async for msg in pb_grpc.WorkerStub(ch).Generate(_gen("r1"), metadata=metadata, timeout=20):
            out.extend(msg.chunk.token_ids)
        return out


async def _abort(address: str, metadata: tuple[tuple[str, str], ...]) -> pb.AbortResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        return await pb_grpc.WorkerStub(ch).Abort(
            pb.AbortRequest(request_id="r1"), metadata=metadata, timeout=5
        )


def test_generate_and_abort_need_the_dispatch_token() -> None:
    settings = WorkerSettings(dispatch_token=DISPATCH)
    runtime = WorkerRuntime(build_engine(settings), settings, worker_id="w-auth")
    runtime.start()
    try:
        for md in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(_generate(runtime.address, md))  # used to stream to anyone who asked
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(_abort(runtime.address, md))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", f"Bearer {DISPATCH}"),)
        assert len(asyncio.run(_generate(runtime.address, good))) == 3
        assert not asyncio.run(_abort(runtime.address, good)).found
    finally:
        runtime.stop()


def test_no_unauthenticated_serving_beyond_loopback() -> None:
    settings = WorkerSettings(bind_host="0.0.0.0")
    with pytest.raises(ValueError, match="ZIPKV_DISPATCH_TOKEN"):
        settings.check_serving_credentials()
    WorkerSettings(bind_host="0.0.0.0", dispatch_token=DISPATCH).check_serving_credentials()
    WorkerSettings(bind_host="127.0.0.1").check_serving_credentials()  # the local stack, said loudly


def test_credentials_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZIPKV_DISPATCH_TOKEN", DISPATCH)
    monkeypatch.setenv("ZIPKV_WORKER_IDENTITY", "zipkv-worker")
    got = WorkerSettings.credentials_from_env()
    assert got["dispatch_token"] == DISPATCH and got["worker_identity"] == "zipkv-worker"


def test_production_path_mutual_tls_end_to_end(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    router_cert = issue(ca, "zipkv-router", tmp_path)
    worker_cert = issue(ca, "zipkv-worker", tmp_path)
    tls = {"cert_file": router_cert.cert_file, "key_file": router_cert.key_file, "ca_file": ca.path}
    cfg = make_config(
        security={"report_token": "", "tls": {k: str(v) for k, v in tls.items()}, "dispatch_token": DISPATCH}
    )
    loop = LoopThread()
    stack = Stack(loop, cfg)
    settings = WorkerSettings(
        router_address=stack.router.report_address,
        report_interval_ms=100,
        bind_host="127.0.0.1",
        dispatch_token=DISPATCH,
        worker_identity="zipkv-worker",
        tls_cert_file=worker_cert.cert_file,
        tls_key_file=worker_cert.key_file,
        tls_ca_file=worker_cert.ca_file,
    )
    runtime = WorkerRuntime(build_engine(settings), settings, worker_id="zipkv-worker/replica-a")
    runtime.start()
    try:
        deadline = time.monotonic() + 10
        while not stack.router.router.store.snapshot().workers:
            assert time.monotonic() < deadline, "the worker's reports over mutual TLS never arrived"
            time.sleep(0.05)
        body = {"model": "zipkv-tiny", "prompt": "hi", "max_tokens": 4, "ignore_eos": True}
        r = httpx.post(stack.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-zipkv-worker"] == "zipkv-worker/replica-a"
        assert r.json()["usage"]["completion_tokens"] == 4
        with pytest.raises(grpc.aio.AioRpcError) as err:  # no client certificate: the handshake fails
            asyncio.run(_generate(runtime.address, (("authorization", f"Bearer {DISPATCH}"),)))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        runtime.stop()
        stack.close()
        loop.close()

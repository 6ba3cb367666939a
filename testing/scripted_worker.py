"""A scripted Worker server: a stand-in for a GPU worker in tests and benchmarks (no model inside).

It speaks the real gRPC `Worker` service on loopback and can report capacity to a router like a real
worker. Its tokens follow a script (`reply` bytes, cycled) so tests can predict the text; knobs make it
refuse, stall, or die mid-stream. The real worker lives in zipkv.worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field

import grpc

from zipkv.controlplane import grpc_keepalive as keepalive
from zipkv.controlplane.grpc_auth import EXCLUSIVE_PORT, TlsFiles, add_port
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc

EOS_ID = 257  # ByteTokenizer.eos_token_id


@dataclass
class Script:
    reply: bytes = b"hello from zipkv "
    itl_s: float = 0.0  # delay between tokens
    ttft_s: float = 0.0  # delay before the first token
    refuse: grpc.StatusCode | None = None  # refuse every Generate with this status
    die_after_tokens: int | None = None  # end the stream with UNAVAILABLE after this many tokens
    stop_after_tokens: int | None = None  # send EOS after this many tokens (finish STOP)
    chunk_tokens: int = 1


@dataclass
class Seen:
    requests: list[pb.GenerateRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    arrived_s: list[float] = field(default_factory=list)  # perf_counter when each Generate arrived
    finished: list[str] = field(default_factory=list)


class ScriptedWorker(pb_grpc.WorkerServicer):
    def __init__(
        self,
        model: str = "zipkv-tiny",
        script: Script | None = None,
        total_tokens: int = 100_000,
        max_context_tokens: int = 4096,
        worker_id: str | None = None,
    ) -> None:
        self.model = model
        self.script = script or Script()
        self.worker_id = worker_id or f"scripted-{uuid.uuid4().hex[:8]}"
        self.total_tokens = total_tokens
        self.max_context_tokens = max_context_tokens
        self.seen = Seen()
        self.running: dict[str, int] = {}  # request_id -> tokens committed
        self.peak_committed_tokens = 0  # the most ever committed at once: over-commit shows here
        self._abort: set[str] = set()
        self._server: grpc.aio.Server | None = None
        self.address = ""
        self.sequence = 0
        self.epoch = int(time.time())

    async def start(self, port: int = 0, tls: TlsFiles | None = None) -> str:
        """Serve on loopback (plaintext, or mutual TLS with `tls`); returns the address."""
        # as the real worker's (worker/runtime.py)
        self._server = grpc.aio.server(options=[EXCLUSIVE_PORT, *keepalive.SERVER_OPTIONS])
        pb_grpc.add_WorkerServicer_to_server(self, self._server)
        bound = add_port(self._server, f"127.0.0.1:{port}", tls)
        await self._server.start()
        self.address = f"127.0.0.1:{bound}"
        return self.address

    async def stop(self, grace_s: float | None = None) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)

    # ---- Worker service -------------------------------------------------------------------------

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        self.seen.arrived_s.append(time.perf_counter())
        self.seen.requests.append(request)
        md = context.invocation_metadata() or ()
        self.seen.metadata.append({k: v if isinstance(v, str) else v.decode() for k, v in md})
        s = self.script
        if s.refuse is not None:
            await context.abort(s.refuse, f"scripted refusal: {s.refuse.name}")
        rid = request.request_id
        self.running[rid] = len(request.prompt_token_ids) + request.sampling.max_new_tokens
        self.peak_committed_tokens = max(self.peak_committed_tokens, sum(self.running.values()))
        try:
            if s.ttft_s:
                await asyncio.sleep(s.ttft_s)
            n_max = request.sampling.max_new_tokens
            sent = 0
            reason = pb.FINISH_REASON_LENGTH
            while sent < n_max:
                if rid in self._abort:
                    reason = pb.FINISH_REASON_ABORT
                    break
                if s.die_after_tokens is not None and sent >= s.die_after_tokens:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted worker died")
                if s.stop_after_tokens is not None and sent >= s.stop_after_tokens:
                    yield pb.GenerateResponse(chunk=pb.TokenChunk(token_ids=[EOS_ID]))
                    reason = pb.FINISH_REASON_STOP
                    break
                n = min(s.chunk_tokens, n_max - sent)
                ids = [s.reply[(sent + i) % len(s.reply)] for i in range(n)]
                yield pb.GenerateResponse(chunk=pb.TokenChunk(token_ids=ids))
                sent += n
                if s.itl_s:
                    await asyncio.sleep(s.itl_s)
            usage = pb.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=sent)
            yield pb.GenerateResponse(finish=pb.Finish(reason=reason, usage=usage))
            self.seen.finished.append(rid)
        finally:
            self.running.pop(rid, None)
            self._abort.discard(rid)

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        self.seen.aborted.append(request.request_id)
        found = request.request_id in self.running
        if found:
            self._abort.add(request.request_id)
        return pb.AbortResponse(found=found)

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(serving=True, draining=False, worker_id=self.worker_id, model=self.model)

    # ---- capacity reports -----------------------------------------------------------------------

    def report(self, **overrides: object) -> pb.CapacityReport:
        """The next report (sequence + 1) from the scripted state; fields may be overridden."""
        self.sequence += 1
        committed = sum(self.running.values())
        fields: dict[str, object] = dict(
            worker_id=self.worker_id,
            address=self.address,
            model=self.model,
            sequence=self.sequence,
            epoch=self.epoch,
            timestamp_s=time.time(),
            headroom_tokens=max(self.total_tokens - committed, 0),
            committed_tokens=committed,
            total_tokens=self.total_tokens,
            compression_ratio=0.7,
            running_requests=len(self.running),
            queued_requests=0,
            queued_prefill_tokens=0,
            ttft_ms=5.0,
            itl_ms=2.0,
            draining=False,
            max_context_tokens=self.max_context_tokens,
            kv_bytes_per_token=4096,
        )
        fields.update(overrides)
        return pb.CapacityReport(**fields)  # type: ignore[arg-type]


async def send_report(router_address: str, report: pb.CapacityReport, token: str = "") -> pb.ReportAck:
    async with grpc.aio.insecure_channel(router_address) as channel:
        stub = pb_grpc.ControlPlaneStub(channel)
        md = (("authorization", f"Bearer {token}"),) if token else None
        return await stub.ReportCapacity(report, metadata=md, timeout=5)


async def report_forever(
    worker: ScriptedWorker, router_address: str, token: str = "", period_s: float = 0.1
) -> None:
    """Report like a real worker until cancelled (one channel, reused)."""
    async with grpc.aio.insecure_channel(router_address) as channel:
        stub = pb_grpc.ControlPlaneStub(channel)
        md = (("authorization", f"Bearer {token}"),) if token else None
        while True:
            # The router may be restarting: the next report tries again.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.ReportCapacity(worker.report(), metadata=md, timeout=2)
            await asyncio.sleep(period_s)


async def _run_cli(args: argparse.Namespace) -> None:
    worker = ScriptedWorker(
        model=args.model, script=Script(itl_s=args.itl_ms / 1000.0), total_tokens=args.total_tokens
    )
    address = await worker.start(args.port)
    print(address, flush=True)
    routers = [a for a in args.router.split(",") if a]
    if routers:  # the same reports to every router, as a real worker does
        await asyncio.gather(*(report_forever(worker, r, args.token, args.report_period_s) for r in routers))
    else:
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """`python -m zipkv.testing.scripted_worker --router HOST:PORT`: a scripted stand-in worker
    process (benchmarks, local experiments). Prints its address, then serves and reports."""
    parser = argparse.ArgumentParser(prog="python -m zipkv.testing.scripted_worker")
    parser.add_argument("--router", default="", help="ControlPlane address(es) to report to, comma-separated")
    parser.add_argument("--token", default="", help="report token")
    parser.add_argument("--model", default="zipkv-tiny")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--total-tokens", type=int, default=10_000_000)
    parser.add_argument("--report-period-s", type=float, default=0.1)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run_cli(args))


if __name__ == "__main__":
    main()

"""Worker-test helpers: a ControlPlane servicer that records reports, a Generate collector, a Llama-3.1-8B
config.json (the SGLang adapter's tests size KV from it)."""

from __future__ import annotations

import asyncio
import threading

import grpc

from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc

# Llama-3.1-8B's config.json, the fields the SGLang adapter reads: 131072 KV bytes per token.
LLAMA_8B = {
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "head_dim": 128,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
}


class RecordingControlPlane(pb_grpc.ControlPlaneServicer):
    """Accepts reports carrying the expected Bearer token and keeps them (a test double of the router)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.reports: list[pb.CapacityReport] = []
        self.refused = 0
        self.lock = threading.Lock()

    def ReportCapacity(self, request: pb.CapacityReport, context: grpc.ServicerContext) -> pb.ReportAck:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        if auth != f"Bearer {self.token}":
            self.refused += 1
            return pb.ReportAck(accepted=False, reason="bad token")
        with self.lock:
            self.reports.append(request)
        return pb.ReportAck(accepted=True)


async def collect(stub: pb_grpc.WorkerStub, request: pb.GenerateRequest) -> tuple[list[int], pb.Finish]:
    tokens: list[int] = []
    finish = pb.Finish()
    async for msg in stub.Generate(request):
        if msg.HasField("chunk"):
            tokens.extend(msg.chunk.token_ids)
        else:
            finish = msg.finish
    return tokens, finish


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]

"""A worker's capacity: one record from its engine to placement, defined once and carried whole.

The engine builds it (``Engine.capacity()``), the reporter puts it on the wire, the router reads it back
into its ``WorkerView``, and placement reads it there. Its field names are ``CapacityReport``'s, so both
copies go by name: a new field is one line here and one in zipkv.proto (tests/test_protos.py checks
that they agree).

Headroom is counted in tokens at this boundary (pages stay inside the engine): the new tokens that still
fit under compression, after the reservations of the requests the engine already admitted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zipkv.protos import zipkv_pb2 as pb


@dataclass(frozen=True, slots=True)
class Capacity:
    headroom_tokens: int  # new tokens that still fit, under compression, after reservations
    committed_tokens: int  # tokens reserved for running requests to reach their max length
    total_tokens: int  # capacity of the KV budget under the current compression ratio
    compression_ratio: float  # stored / uncompressed bytes of full pages (1.0 when none compressed)
    running_requests: int  # admitted, in prefill or decoding
    queued_requests: int  # taken by the engine, not yet admitted
    queued_prefill_tokens: int  # prompt tokens not yet prefilled: queued requests and those in prefill
    ttft_ms: float  # recent mean time to first token
    itl_ms: float  # recent mean inter-token latency (decode step time)
    max_context_tokens: int  # the model's context on this worker (0 = not known)
    kv_bytes_per_token: int  # uncompressed KV bytes per token over all layers

    def report_fields(self) -> dict[str, Any]:
        """The fields, by name, as ``CapacityReport(**...)`` takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_report(cls, report: pb.CapacityReport) -> Capacity:
        return cls(**{f.name: getattr(report, f.name) for f in dataclasses.fields(cls)})

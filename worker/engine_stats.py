"""What an engine tells the worker besides tokens: one request's timings, and its KV pool's state.

Both are plain frozen data filled by the engine (reference or SGLang) on its own thread, with host clocks
only: the worker turns timings into spans (`request_spans.py`) and KV stats into Prometheus series
(`metrics.py`), so no engine imports OpenTelemetry or prometheus-client and nothing waits for the device.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Buckets of the encode-launch latency histogram, in ms (a launch encodes every page a step filled).
ENCODE_MS_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0)


def now_ns() -> int:
    """Wall-clock nanoseconds, the clock OpenTelemetry spans use."""
    return time.time_ns()


@dataclass(frozen=True)
class RequestTimings:
    """Where one request's time went inside the engine (wall-clock ns; 0 = not known to this engine).

    queued -> admitted is the queue wait; admitted -> admission_done the admission (reserving its pages);
    prefill_start -> prefill_end the step that computed the prompt (its first token comes out of it);
    prefill_end -> finished the decode, `decode_steps` steps producing `decode_tokens` tokens."""

    queued_ns: int
    admitted_ns: int = 0
    admission_done_ns: int = 0
    prefill_start_ns: int = 0
    prefill_end_ns: int = 0
    finished_ns: int = 0
    prefill_tokens: int = 0  # prompt tokens computed (the prompt less the prefix-cache hit)
    prefix_hit_tokens: int = 0  # prompt tokens served from a prefix cache
    prefill_batch_requests: int = 0  # requests whose prefill shared that step (0 = not known)
    decode_tokens: int = 0
    decode_steps: int = 0
    reserved_tokens: int = 0  # KV reserved at admission for the request's worst case (0 = not known)
    headroom_tokens: int = 0  # free KV tokens (under compression) when it was admitted (0 = not known)


def decode_kernel_label(
    compression: bool, env: Mapping[str, str] | None = None, impl: str | None = None
) -> str:
    """The fused decode kernel a plan runs (``impl``, else `$ZIPKV_DECODE_IMPL`: portable Triton or the
    Hopper kernel), with its shape override (`$ZIPKV_DECODE_KERNEL`) when set; the twin when nothing is
    compressed."""
    from zipkv.kernels.attention.decode_config import DECODE_IMPL_ENV, KERNEL_CONFIG_ENV

    env = os.environ if env is None else env
    impl = impl or env.get(DECODE_IMPL_ENV)
    label = "hopper_fused" if impl == "hopper" else "triton_fused"
    if not compression:
        label += "_uncompressed_twin"
    return label + (f"[{env[KERNEL_CONFIG_ENV]}]" if env.get(KERNEL_CONFIG_ENV) else "")


@dataclass(frozen=True)
class KernelsInUse:
    decode: str  # e.g. "triton_fused", "torch_reference"
    encode: str  # the page encoder
    extend: str = "-"  # how an extend reads a cached prefix (SGLang: "restore" or "fused")
    page_format: str = "-"


@dataclass(frozen=True)
class KVStats:
    """The KV pool now (pages count page ids, each with a page in every layer) and the encoder so far."""

    budget_bytes: int
    stored_bytes: int  # bytes the live pages hold, as stored
    raw_bytes: int  # what the live pages would hold uncompressed
    raw_pages: int
    compressed_pages: int
    encoding_pages: int
    kernels: KernelsInUse
    encode: EncodeCounts


@dataclass(frozen=True)
class EncodeCounts:
    """The page encoder so far (cumulative): launches, pages encoded, and the launches' latencies in
    ENCODE_MS_BUCKETS (one count per bucket, the last one past the largest bound; measured launches only:
    on a GPU a launch's latency is known once its events have completed)."""

    launches: int = 0
    pages: int = 0
    latency_counts: tuple[int, ...] = (0,) * (len(ENCODE_MS_BUCKETS) + 1)
    latency_sum_ms: float = 0.0

    def observed(self, ms: float) -> EncodeCounts:
        """These counts with one more measured latency."""
        counts = list(self.latency_counts)
        counts[bisect.bisect_left(ENCODE_MS_BUCKETS, ms)] += 1
        return EncodeCounts(self.launches, self.pages, tuple(counts), self.latency_sum_ms + ms)


def kv_stats_of(
    pool_stats: Any, raw_page_bytes: int, num_layers: int, encode: EncodeCounts, kernels: KernelsInUse
) -> KVStats:
    """KVStats from a `zipkv.allocator.PoolStats` (host counters only)."""
    return KVStats(
        budget_bytes=int(pool_stats.budget_bytes),
        stored_bytes=int(pool_stats.used_bytes),
        raw_bytes=int(pool_stats.used_pages) * num_layers * raw_page_bytes,
        raw_pages=int(pool_stats.raw_pages),
        compressed_pages=int(pool_stats.compressed_pages),
        encoding_pages=int(pool_stats.encoding_pages),
        kernels=kernels,
        encode=encode,
    )

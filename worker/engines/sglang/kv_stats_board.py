"""The SGLang scheduler's KV pool stats, handed to the replica through a small shared-memory file.

zipkv's pool lives in SGLang's scheduler process, the replica's /metrics in the parent. The replica
creates the board (a float64 array in a file under /dev/shm) and names it in `ZIPKV_KV_STATS_FILE`, which
the spawned scheduler inherits; the scheduler's allocator publishes `PagePool.stats()` (host counters)
and the encoder's counts every PUBLISH_EVERY_STEPS forward steps, and the replica reads the latest at
scrape time. No device sync, no locks: a sequence number (odd while writing) lets a reader retry a torn read.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zipkv.worker.encode_timer import TimedEncoder
from zipkv.worker.engine_stats import ENCODE_MS_BUCKETS, EncodeCounts, KernelsInUse, KVStats, kv_stats_of

ENV = "ZIPKV_KV_STATS_FILE"
PUBLISH_EVERY_STEPS = 16
_SCALARS = (
    "budget_bytes", "stored_bytes", "raw_bytes", "raw_pages", "compressed_pages", "encoding_pages",
    "encode_launches", "encode_pages", "encode_latency_sum_ms",
)  # fmt: skip
_SLOTS = 1 + len(_SCALARS) + len(ENCODE_MS_BUCKETS) + 1  # sequence, scalars, latency bucket counts


class KVStatsBoard:
    def __init__(self, path: Path, owner: bool) -> None:
        self.path, self._owner = path, owner
        self._array: Any = np.memmap(path, dtype=np.float64, mode="r+", shape=(_SLOTS,))

    @classmethod
    def create(cls) -> KVStatsBoard:
        """A new, empty board (the replica's); `env()` names it for the processes it starts."""
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, name = tempfile.mkstemp(prefix="zipkv-kv-stats-", dir=folder)
        os.write(fd, bytes(8 * _SLOTS))
        os.close(fd)
        return cls(Path(name), owner=True)

    @classmethod
    def from_env(cls) -> KVStatsBoard | None:
        """The board the replica named, in the scheduler process; None when there is none."""
        name = os.environ.get(ENV)
        return cls(Path(name), owner=False) if name and os.path.isfile(name) else None

    def env(self) -> dict[str, str]:
        return {ENV: str(self.path)}

    def publish(self, stats: KVStats) -> None:
        a, e = self._array, stats.encode
        values = [
            stats.budget_bytes, stats.stored_bytes, stats.raw_bytes, stats.raw_pages, stats.compressed_pages,
            stats.encoding_pages, e.launches, e.pages, e.latency_sum_ms, *e.latency_counts,
        ]  # fmt: skip
        a[0] += 1  # odd: writing
        a[1:] = values
        a[0] += 1

    def publish_pool(self, pool: Any) -> None:
        """Publish a `zipkv.allocator.PagePool`'s state (its encoder's counts when it is a TimedEncoder)."""
        encoder = getattr(pool, "encoder", None)
        counts = encoder.poll() if isinstance(encoder, TimedEncoder) else EncodeCounts()
        unknown = KernelsInUse(decode="-", encode="-")  # the reader knows the kernels
        self.publish(kv_stats_of(pool.stats(), pool.fmt.raw_page_bytes, pool.num_layers, counts, unknown))

    def read(self, kernels: KernelsInUse, tries: int = 8) -> KVStats | None:
        """The latest published stats; None before the first publish (or when every try was torn)."""
        for _ in range(tries):
            seq = float(self._array[0])
            values = np.array(self._array[1:])
            if seq == 0 or seq % 2 or float(self._array[0]) != seq:
                continue
            n = len(_SCALARS)
            s = dict(zip(_SCALARS, values[:n].tolist(), strict=True))
            encode = EncodeCounts(
                launches=int(s["encode_launches"]),
                pages=int(s["encode_pages"]),
                latency_counts=tuple(int(c) for c in values[n:]),
                latency_sum_ms=float(s["encode_latency_sum_ms"]),
            )
            return KVStats(
                budget_bytes=int(s["budget_bytes"]),
                stored_bytes=int(s["stored_bytes"]),
                raw_bytes=int(s["raw_bytes"]),
                raw_pages=int(s["raw_pages"]),
                compressed_pages=int(s["compressed_pages"]),
                encoding_pages=int(s["encoding_pages"]),
                kernels=kernels,
                encode=encode,
            )
        return None

    def close(self) -> None:
        """Release the mapping; the owner also removes the file."""
        mm = getattr(self._array, "_mmap", None)
        self._array = None
        if mm is not None:
            mm.close()
        if self._owner:
            self.path.unlink(missing_ok=True)

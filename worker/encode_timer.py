"""A page encoder that counts its launches and times them without waiting for the device.

`PagePool` takes its encoder as an argument (`zipkv.allocator.device.PageEncoder`); the reference engine's
KV store and the SGLang pool hand it a `TimedEncoder` around the default one. On the CPU a launch runs to
completion inside the call, so its wall time is its latency. On CUDA two timing events bracket the launch
on the current stream (zipkv.allocator.device_timer) and `poll()` takes in the ones whose end event has
completed (`Event.query()`, which never blocks); a launch's latency is counted once its events are done.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from zipkv.allocator.device import PageEncoder
from zipkv.allocator.device_timer import DeviceTimer
from zipkv.worker.engine_stats import EncodeCounts

MAX_PENDING_LAUNCHES = 1024  # events kept for launches not yet done; older ones are dropped, not waited for


class TimedEncoder:
    def __init__(self, encoder: PageEncoder, device: torch.device | str) -> None:
        self._encoder = encoder
        self._cuda = torch.device(device).type == "cuda"
        self._timer = DeviceTimer(self._cuda, max_pending=MAX_PENDING_LAUNCHES, keep_spans=True)
        self._counts = EncodeCounts()

    def __call__(
        self,
        heap: torch.Tensor,
        src_offsets: torch.Tensor,
        dst_offsets: torch.Tensor,
        meta_out: torch.Tensor,
        sizes_out: torch.Tensor,
        fmt: Any,
    ) -> None:
        c = self._counts
        self._counts = dataclasses.replace(
            c, launches=c.launches + 1, pages=c.pages + int(src_offsets.numel())
        )
        if self._cuda:  # timed by events (none while a CUDA graph is being captured)
            with self._timer.span():
                self._encoder(heap, src_offsets, dst_offsets, meta_out, sizes_out, fmt)
            return
        t0 = time.perf_counter()
        self._encoder(heap, src_offsets, dst_offsets, meta_out, sizes_out, fmt)
        self._counts = self._counts.observed((time.perf_counter() - t0) * 1e3)

    def poll(self) -> EncodeCounts:
        """The counts so far, with the latencies of every launch whose device work has finished."""
        for ms in self._timer.completed_ms():
            self._counts = self._counts.observed(ms)
        return self._counts

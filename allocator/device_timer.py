"""GPU time of device work the host only launches (the pool's encodes and moves, a prefix's restore), for the
pool's log line: a CUDA event pair around each launch, summed once both have completed, never waited for (the
pool's step must not sync: pool.py). Off the GPU, or while a stream is being captured into a CUDA graph
(an event recorded there belongs to the graph, not to this step), a span records nothing.

The serving runs' logs say how much of a step these take (docs/benchmarks.md, "Serving under SLO ... all
three systems": zipkv's prefill costs 9.5% more per token than with compression off, and these spans are
where that time would be).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

MAX_PENDING = 4096  # pairs not yet read back; beyond it the oldest are dropped (and counted as dropped)


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...


def _cuda_event() -> TimingEvent:
    return torch.cuda.Event(enable_timing=True)


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


class DeviceTimer:
    """Sums the device time of spans (ms) and counts them; ``take`` returns the totals since the last take."""

    def __init__(
        self,
        enabled: bool,
        event: Callable[[], TimingEvent] = _cuda_event,
        capturing: Callable[[], bool] = _capturing,
    ) -> None:
        self.enabled = enabled
        self._event, self._capturing = event, capturing
        self._pending: deque[tuple[TimingEvent, TimingEvent]] = deque()
        self._ms, self._spans, self.dropped = 0.0, 0, 0

    @contextmanager
    def span(self) -> Iterator[None]:
        """Time the device work launched inside the block on the current stream."""
        if not self.enabled or self._capturing():
            yield
            return
        start, end = self._event(), self._event()
        start.record()
        yield
        end.record()
        self._pending.append((start, end))
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self.dropped += 1

    def collect(self) -> None:
        """Add the spans that have completed, oldest first (a stream runs them in order), without waiting."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            self._ms += start.elapsed_time(end)
            self._spans += 1

    def take(self) -> tuple[float, int]:
        """(ms, spans) completed since the last take; spans still running count at the next one."""
        self.collect()
        out = (self._ms, self._spans)
        self._ms, self._spans = 0.0, 0
        return out


def timers_for(device: torch.device, names: tuple[str, ...]) -> dict[str, DeviceTimer]:
    """One timer per name, timing on a CUDA device and off elsewhere."""
    return {name: DeviceTimer(device.type == "cuda") for name in names}

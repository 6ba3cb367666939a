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
    """Device time of spans, handed back once completed: ``completed_ms`` one by one (the encoder's latency
    histogram, worker/encode_timer.py), ``take`` as a sum and a count (the pool's log line)."""

    def __init__(
        self,
        enabled: bool,
        event: Callable[[], TimingEvent] = _cuda_event,
        capturing: Callable[[], bool] = _capturing,
        max_pending: int | None = None,
    ) -> None:
        self.enabled = enabled
        self._event, self._capturing = event, capturing
        self._max_pending = max_pending
        self._pending: deque[tuple[TimingEvent, TimingEvent]] = deque()
        self.dropped = 0

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
        if len(self._pending) > (self._max_pending or MAX_PENDING):
            self._pending.popleft()
            self.dropped += 1

    def completed_ms(self) -> list[float]:
        """The spans that have completed since the last call, oldest first (a stream runs them in order),
        without waiting; spans still running come with a later call."""
        done: list[float] = []
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            done.append(float(start.elapsed_time(end)))
        return done

    def take(self) -> tuple[float, int]:
        """(ms, spans) completed since the last take."""
        done = self.completed_ms()
        return sum(done), len(done)


def timers_for(device: torch.device, names: tuple[str, ...]) -> dict[str, DeviceTimer]:
    """One timer per name, timing on a CUDA device and off elsewhere."""
    return {name: DeviceTimer(device.type == "cuda") for name in names}

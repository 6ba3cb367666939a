"""GPU time of device work the host only launches (the pool's encodes and moves, a prefix's restore), for the
pool's log line: a CUDA event pair around each launch, summed once both have completed, never waited for (the
pool's step must not sync: pool.py). Off the GPU, or while a stream is being captured into a CUDA graph
(an event recorded there belongs to the graph, not to this step), a span records nothing.

The serving runs' logs say how much of a step these take (docs/benchmarks.md, "Serving under SLO ... all
three systems": on the trace zipkv's prefill takes 5-6% more time than with compression off, and these
spans, with the host's, say how much of that the pool's own launches take).
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
    """Device time of spans, taken in as they complete (checked at each new span, so only spans still in
    flight are held): ``take`` gives their sum and count since the last take (the pool's log line), and with
    ``keep_spans`` ``completed_ms`` gives them one by one (the encoder's latency histogram, the newest
    MAX_PENDING kept; worker/encode_timer.py). ``max_pending`` bounds the spans in flight."""

    def __init__(
        self,
        enabled: bool,
        event: Callable[[], TimingEvent] = _cuda_event,
        capturing: Callable[[], bool] = _capturing,
        max_pending: int | None = None,
        keep_spans: bool = False,
    ) -> None:
        self.enabled = enabled
        self._event, self._capturing = event, capturing
        self._max_pending = max_pending
        self._pending: deque[tuple[TimingEvent, TimingEvent]] = deque()
        self._kept: deque[float] | None = deque(maxlen=MAX_PENDING) if keep_spans else None
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
        self._collect()
        if len(self._pending) > (self._max_pending or MAX_PENDING):
            self._pending.popleft()
            self.dropped += 1

    def _collect(self) -> None:
        """Take in the spans that have completed, oldest first (a stream runs them in order), no waiting."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            ms = float(start.elapsed_time(end))
            self._ms, self._spans = self._ms + ms, self._spans + 1
            if self._kept is not None:
                self._kept.append(ms)

    def completed_ms(self) -> list[float]:
        """(keep_spans) Each span completed since the last call, oldest first; later ones come next time."""
        if self._kept is None:
            raise RuntimeError("completed_ms needs DeviceTimer(..., keep_spans=True)")
        self._collect()
        out = list(self._kept)
        self._kept.clear()
        return out

    def take(self) -> tuple[float, int]:
        """(ms, spans) completed since the last take."""
        self._collect()
        out = (self._ms, self._spans)
        self._ms, self._spans = 0.0, 0
        return out


def timers_for(device: torch.device, names: tuple[str, ...]) -> dict[str, DeviceTimer]:
    """One timer per name, timing on a CUDA device and off elsewhere."""
    return {name: DeviceTimer(device.type == "cuda") for name in names}

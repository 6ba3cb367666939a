"""Host time of the allocator's calls on SGLang's scheduling path, for the pool's log line: each call in
HOST_TIMED is wrapped, on the instance, to add its wall time to a per-name total that the line reads and
resets (telemetry.log_pool_step); compress_step is one of them, so the sum includes the pool's end_step
(its own figure on the same line). The scheduler runs these between GPU steps, so time here is time the GPU
may wait (with SGLang's overlap schedule, only what exceeds the step it overlaps). With compression the
allocator does more per call (readbacks of filled pages, the cache's over-count), and on the serving trace
zipkv's prefill took 5-6% more time than with compression off (docs/benchmarks.md): this says how much of
that is the host's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

HOST_TIMED = (
    "alloc_extend", "alloc_decode", "available_size", "free", "compress_step", "decode_room",
    "refresh_headroom",  # tensor parallelism: the ranks' agreement at each pass, its wait for the others
)  # fmt: skip
# Host time blocked on the device (the readback queue drained with block=True) inside the timed calls: a
# part of their time, kept apart so a log tells waiting from work; not added into the sum.
WAITED = "waited"


def time_host_calls(obj: object, names: tuple[str, ...] = HOST_TIMED) -> dict[str, float]:
    """Wrap ``obj``'s methods ``names`` so each call adds its seconds to the returned totals (by name). A
    timed call made inside another (a reclaim's eviction frees pages inside alloc_extend) counts in the
    outer one only, so the totals add up to wall time."""
    totals = dict.fromkeys((*names, WAITED), 0.0)
    depth = [0]
    for name in names:
        setattr(obj, name, _timed(getattr(obj, name), name, totals, depth))
    return totals


def _timed(
    fn: Callable[..., Any], name: str, totals: dict[str, float], depth: list[int]
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                totals[name] += time.perf_counter() - t0

    return timed


def take_host_ms(totals: dict[str, float]) -> dict[str, float]:
    """Each total in ms since the last take, WAITED included, and reset them."""
    ms = {name: 1000.0 * s for name, s in totals.items()}
    for name in totals:
        totals[name] = 0.0
    return ms

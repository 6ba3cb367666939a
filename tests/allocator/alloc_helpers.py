"""Shared pieces of the allocator tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zipkv.allocator.ledger import Ledger, LedgerConfig
from zipkv.allocator.plans import EncodePlan


class ManualFence:
    """A fence the test completes by hand: stands for device work that has not finished yet."""

    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


class FenceLog:
    """Fence factory that keeps every fence so a test can finish them when it chooses."""

    def __init__(self, finished: bool = False) -> None:
        self.fences: list[ManualFence] = []
        self.finished = finished

    def __call__(self) -> ManualFence:
        fence = ManualFence()
        fence.finished = self.finished
        self.fences.append(fence)
        return fence

    def finish_all(self) -> None:
        for fence in self.fences:
            fence.finished = True


def ledger(
    layers: int = 2,
    chunks: int = 8,
    chunk_units: int = 64,
    raw: int = 16,
    max_pages: int = 64,
    shared_pool: bool = True,
    compression: bool = True,
    fences: Callable[[], ManualFence] | None = None,
    unit_bytes: int = 256,
) -> Ledger:
    cfg = LedgerConfig(
        layers, chunks, chunk_units, raw, max_pages, shared_pool, compression, unit_bytes=unit_bytes
    )
    return Ledger(cfg) if fences is None else Ledger(cfg, fences)


def encode_with(
    led: Ledger, size_units: Callable[[EncodePlan], np.ndarray], fence: ManualFence | None = None
) -> EncodePlan | None:
    """Plan an encode launch and hand the ledger the stored sizes ``size_units(plan)`` (in units)."""
    plan = led.plan_encode()
    if plan is None:
        return None
    sizes = np.asarray(size_units(plan), dtype=np.int64) * led.cfg.unit_bytes
    done = ManualFence() if fence is None else fence
    if fence is None:
        done.finished = True
    led.launched(plan, done, lambda: sizes)
    return plan

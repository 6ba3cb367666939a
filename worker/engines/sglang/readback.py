"""Page ids read back from the device to the host without a sync, for the SGLang allocator (allocator.py).

Which pages a step fills and which pages SGLang frees are only known on the device (SGLang passes slot
tensors). `copy_to_host` starts a non-blocking copy into pinned host memory and records a `torch.cuda.Event`;
a `Readback` holds that copy until the event says it landed, and a `ReadbackQueue` applies them in the
order SGLang made them: a free takes its pages back at once, a fill waits for the step after the one that
writes it. Split from allocator.py because the copy-and-fence mechanics and their order are a
responsibility of their own, apart from the allocator's page accounting. No sglang import here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Readback:
    """Page ids copied device -> pinned host, applied once ``event`` completed (FIFO)."""

    kind: str  # "fill" | "free"
    step: int  # fills: the forward step that writes these pages
    known: list[int]  # ids already known on the host
    copy: torch.Tensor | None  # int64 host tensor being filled, or None
    event: Any  # torch.cuda.Event | None

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def ids(self) -> list[int]:
        out = list(self.known)
        if self.copy is not None:
            out.extend(int(x) for x in self.copy.tolist())
        return out


def copy_to_host(device_ids: torch.Tensor | None) -> tuple[torch.Tensor | None, Any]:
    """Start copying page ids to host memory: (host tensor or None, event or None). On the GPU the copy
    goes to pinned memory without a sync and the event says when it landed; elsewhere it is done at once."""
    if device_ids is None or device_ids.numel() == 0:
        return None, None
    ids = device_ids.to(torch.int64)
    if ids.device.type != "cuda":
        return ids.clone(), None
    host = torch.empty(ids.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(ids, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class ReadbackQueue:
    """Fills and frees of page ids known on the device, applied in order once their copies landed.

    A landed free goes to ``free`` at once (less the page ids in ``keep``) and is taken out of the fills
    still waiting, so a page freed before it was marked full is never marked; a landed fill waits in
    `take_filled` until its forward step has passed.
    """

    def __init__(self, keep: frozenset[int]) -> None:
        self._keep = keep
        self._queue: deque[Readback] = deque()
        self._waiting_fills: list[tuple[int, set[int]]] = []  # (forward step, page ids) not yet marked full

    def add_fill(self, step: int, known: list[int], device_ids: torch.Tensor | None) -> None:
        """Pages that forward step ``step`` fills: ``known`` on the host, ``device_ids`` on the device."""
        copy, event = copy_to_host(device_ids)
        self._queue.append(Readback("fill", step, known, copy, event))

    def add_free(self, page_ids: torch.Tensor) -> None:
        copy, event = copy_to_host(page_ids)
        self._queue.append(Readback("free", 0, [], copy, event))

    def drain(self, block: bool, free: Callable[[list[int]], None]) -> None:
        """Apply landed readbacks in order; with ``block``, wait for all of them (idle checks, OOM)."""
        while self._queue:
            head = self._queue[0]
            if not head.ready():
                if not block:
                    return
                head.event.synchronize()
            self._queue.popleft()
            ids = head.ids()
            if head.kind == "fill":
                self._waiting_fills.append((head.step, set(ids)))
                continue
            freed = set(ids) - self._keep
            for _, waiting in self._waiting_fills:
                waiting -= freed
            free(sorted(freed))

    def take_filled(self, step: int) -> list[int]:
        """The landed fills of forward steps before ``step``, sorted: their pages are written now."""
        ready = [ids for s, ids in self._waiting_fills if s < step]
        self._waiting_fills = [(s, ids) for s, ids in self._waiting_fills if s >= step]
        return sorted(set().union(*ready)) if ready else []

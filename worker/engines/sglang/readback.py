"""Page ids read back from the device to the host without a sync, for the SGLang allocator (allocator.py).

Which pages a step fills and which pages SGLang frees are only known on the device (SGLang passes slot
tensors). `copy_to_host` starts a non-blocking copy into pinned host memory and records a `torch.cuda.Event`;
a `Readback` holds that copy until the event says it landed, and the allocator applies readbacks in order.
Split from allocator.py because the copy-and-fence mechanics are a responsibility of their own, apart from
the allocator's page accounting. No sglang import here.
"""

from __future__ import annotations

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

"""The device side's small parts: fences, the encoder seam, uploads, the raw-page metadata row.

The encoder comes from ``zipkv.kernels`` (``codec.encode_pages`` on CUDA, its torch reference twin on the
CPU) behind the ``PageEncoder`` protocol, so a caller may pass its own (e.g. an instrumented one).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from zipkv.allocator.plans import CompletedFence, Fence
from zipkv.kernels.format.layout import OFFSET_BYTES, RAW_MARKER, PageFormat
from zipkv.kernels.format.layout_v3 import RAW_PAGE_MARKER


class PageEncoder(Protocol):
    """``kernels.codec.encode_pages``: compress ``n`` full raw pages of ``heap`` in one launch.

    Reads raw pages at byte offsets ``src_offsets`` (int64 [n]), writes each encoded page at
    ``dst_offsets`` (room for ``fmt.raw_page_bytes``), its metadata into ``meta_out``
    (uint8 [n, 2H, meta_bytes]) and its stored bytes into ``sizes_out`` (int32 [n]). No host sync.
    """

    def __call__(
        self,
        heap: torch.Tensor,
        src_offsets: torch.Tensor,
        dst_offsets: torch.Tensor,
        meta_out: torch.Tensor,
        sizes_out: torch.Tensor,
        fmt: PageFormat,
    ) -> None: ...


class CudaFence:
    """A CUDA event recorded on the current stream: done once every launch before it has finished."""

    def __init__(self) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def done(self) -> bool:
        return bool(self.event.query())


def fence_factory(device: torch.device) -> type[Fence]:
    # CPU ops run to completion inside the call that issues them, so a CPU fence is done when made.
    return CudaFence if device.type == "cuda" else CompletedFence


def default_encoder(device: torch.device) -> PageEncoder:
    """The Triton codec's one-launch ``encode_pages`` on CUDA; its torch reference twin elsewhere (both
    read ``fmt.version``)."""
    if device.type == "cuda":
        from zipkv.kernels.codec import pages as codec

        return codec.encode_pages
    from zipkv.kernels.reference import pages as reference

    return reference.encode_pages


def raw_meta_row(fmt: PageFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 [2H, meta_bytes]: metadata of an uncompressed page (v1/v2: raw offsets, every marker raw;
    v3: every byte RAW_PAGE_MARKER, kernels/format/layout_v3.py)."""
    if fmt.version >= 3:
        return torch.full((fmt.page_heads_per_page, fmt.meta_bytes), RAW_PAGE_MARKER, dtype=torch.uint8).to(
            device
        )
    rows = np.zeros((fmt.page_heads_per_page, fmt.meta_bytes), dtype=np.uint8)
    for i in range(fmt.page_heads_per_page):
        offset = i * fmt.raw_page_head_bytes
        rows[i, :OFFSET_BYTES] = np.frombuffer(offset.to_bytes(OFFSET_BYTES, "little"), dtype=np.uint8)
        rows[i, OFFSET_BYTES : OFFSET_BYTES + fmt.blocks_per_page_head] = RAW_MARKER
    return torch.from_numpy(rows).to(device)


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host int64 array -> device tensor without waiting for the device (pinned copy on CUDA)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host

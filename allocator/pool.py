"""PagePool: one device heap for every page of every layer, with a page table the kernels read.

The allocator's four rules (docs/design.md): (1) new pages are allocated at raw size; (2) compressed
pages move and ``page_loc`` maps the stable page id to the current place; (3) per-layer space plus a
shared pool of empty chunks, returned only when no read is in flight (fences);
(4) ``headroom_pages()`` after reservations.

Device tensors (fixed addresses for the pool's life, updated in place, so CUDA graphs can replay):
  heap      uint8 [budget_bytes, rounded down to a unit]      every page, raw or compressed
  page_loc  int64 [num_layers, max_pages]                     byte offset of page p of layer l
  page_meta uint8 [num_layers, max_pages, 2H, fmt.meta_bytes] the format's per-page-head metadata
Places and sizes are in units of ``unit_bytes_for(fmt)`` (256 bytes for formats v1/v2, 64 for v3). The
last unit of the heap is a scratch unit the pack step writes discarded bytes to.

Per step: ``allocate`` / ``free`` / ``mark_full`` while scheduling, then one ``end_step()`` that issues a
single encode launch for every page that filled (all layers), packs the results, and applies what has
arrived from earlier launches. Nothing here waits for the device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from zipkv.allocator.device import PageEncoder, default_encoder, fence_factory, raw_meta_row, upload
from zipkv.allocator.device_timer import timers_for
from zipkv.allocator.ledger import Ledger, LedgerConfig
from zipkv.allocator.pack import Packer, pack_choice
from zipkv.allocator.plans import ChunkKind, EncodePlan, MovePlan, PageState, PoolStats
from zipkv.kernels.format.layout import PageFormat

MiB = 1 << 20
PACK_TEMP_BYTES = 64 * MiB  # bound on the temporary copy the pack and move steps make per slice
DEVICE_SPANS = ("encode", "move", "restore")  # restore: a prefix's pages read back for prefill (kvstore)


def unit_bytes_for(fmt: PageFormat) -> int:
    """The pool's unit for a page format: what one compressed block saves (v1/v2 1024 - 768 = 256 bytes,
    v3 256 - 192 = 64). Every stored page is a whole number of units, so the encoder's sizes place pages
    exactly; units keep the codec's alignment; and stats() counts each unit saved as a compressed block."""
    unit = fmt.raw_block_bytes - fmt.compressed_block_bytes
    if fmt.raw_page_bytes % unit or fmt.min_page_bytes % unit or unit % fmt.page_alignment_bytes:
        raise ValueError(  # a format change broke the arithmetic the pool relies on
            f"page format v{fmt.version}: pages of {fmt.raw_page_bytes} and {fmt.min_page_bytes} B are not "
            f"whole {unit} B units aligned to {fmt.page_alignment_bytes} B; the allocator needs them to be"
        )
    return unit


@dataclass(frozen=True)
class LayerPages:
    """One layer's pages as the kernels read them: the shared heap and this layer's rows of the page table
    and metadata (views of the pool's tensors, so they stay valid, and capture-stable, for its life)."""

    heap: torch.Tensor  # uint8 [heap bytes]: every page of every layer
    loc: torch.Tensor  # int64 [max_pages]: byte offset of each page of this layer
    meta: torch.Tensor  # uint8 [max_pages, 2H, meta_bytes]


class PagePool:
    DEFAULT_COMPACTION_INTERVAL_STEPS = 2
    _packer: Packer | None = None  # made at the first encode, over the heap's units

    def __init__(
        self,
        fmt: PageFormat,
        num_layers: int,
        budget_bytes: int,
        chunk_bytes: int = 2 * MiB,
        device: str | torch.device = "cpu",
        shared_pool: bool = True,
        compression: bool = True,
        max_pages: int | None = None,
        encoder: PageEncoder | None = None,
        compaction_live_fraction: float = 0.5,
        compaction_interval_steps: int = DEFAULT_COMPACTION_INTERVAL_STEPS,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % fmt.raw_page_bytes != 0:
            raise ValueError(
                f"chunk_bytes {chunk_bytes} must be a positive multiple of the raw page size "
                f"{fmt.raw_page_bytes} B ({fmt.ascii_map().splitlines()[0]})"
            )
        self.unit_bytes = unit = unit_bytes_for(fmt)
        budget_bytes -= budget_bytes % unit  # the codec addresses the heap in aligned units
        num_chunks = (budget_bytes - unit) // chunk_bytes
        if num_chunks < num_layers:
            raise ValueError(
                f"budget_bytes {budget_bytes} holds {max(num_chunks, 0)} chunks of {chunk_bytes} B (after a "
                f"{unit} B scratch unit) but {num_layers} layers need one each; raise the budget"
            )
        chunk_units, raw_units = chunk_bytes // unit, fmt.raw_page_bytes // unit
        if max_pages is None:  # every page id needs a page in every layer, at least min_page_bytes each
            max_pages = max(1, num_chunks * chunk_bytes // (num_layers * fmt.min_page_bytes))
        self.fmt, self.num_layers, self.compression = fmt, num_layers, compression
        self.device = torch.device(device)
        self.pack_impl = pack_choice(self.device.type)  # how encoded pages are packed ($ZIPKV_POOL_PACK)
        self.ledger = Ledger(
            LedgerConfig(
                num_layers=num_layers,
                num_chunks=num_chunks,
                chunk_units=chunk_units,
                raw_page_units=raw_units,
                max_pages=max_pages,
                shared_pool=shared_pool,
                compression=compression,
                compaction_live_fraction=compaction_live_fraction,
                unit_bytes=unit,
            ),
            fence_factory(self.device),
        )
        self.encoder = encoder if encoder is not None else default_encoder(self.device)
        self.compaction_interval_steps = compaction_interval_steps
        self._steps, self.compacted_pages = 0, 0  # end_steps; (layer, page) pairs compaction moved so far
        self._make_heap(budget_bytes, max_pages, num_chunks * chunk_units)
        self.device_timers = timers_for(self.device, DEVICE_SPANS)  # the log line's launches and restores
        self.end_step_host_s = self.settle_host_s = 0.0  # host time in end_step; waiting in settle

    def _make_heap(self, budget_bytes: int, max_pages: int, chunk_area_units: int) -> None:
        """The heap, its page tables and its views: units of ``unit_bytes``, the chunks' ``chunk_area_units``
        then one scratch unit."""
        unit, fmt, num_layers = self.unit_bytes, self.fmt, self.num_layers
        self._raw_meta = raw_meta_row(fmt, self.device)
        self.heap = torch.zeros(budget_bytes, dtype=torch.uint8, device=self.device)
        self.page_loc = torch.zeros((num_layers, max_pages), dtype=torch.int64, device=self.device)
        self.page_meta = self._raw_meta.expand(num_layers, max_pages, -1, -1).contiguous()
        # Units as rows of 8-byte words: the pack and move copies gather and scatter words, not bytes
        self._units = self.heap[: (chunk_area_units + 1) * unit].view(torch.int64).view(-1, unit // 8)
        self._scratch_unit = chunk_area_units
        self._slice_pages = max(1, PACK_TEMP_BYTES // fmt.raw_page_bytes)
        self._layers = [LayerPages(self.heap, self.page_loc[i], self.page_meta[i]) for i in range(num_layers)]

    @property
    def max_pages(self) -> int:
        return self.ledger.cfg.max_pages

    def layer(self, layer: int) -> LayerPages:
        """What the kernels read of ``layer`` (engines go through this, not the pool's tensors)."""
        return self._layers[layer]

    # ---- scheduling --------------------------------------------------------------------------------
    def allocate(self, n_pages: int, request_id: str | Sequence[str] | None = None) -> list[int]:
        """``n_pages`` new page ids, each at raw size in every layer; raises OutOfPages if they don't fit.

        ``request_id`` (one, or one per page) draws on that request's reservation first.
        """
        ids, units = self.ledger.allocate(n_pages, request_id)
        if ids.size:
            idx = upload(ids, self.device)
            self.page_loc[:, idx] = upload(units * self.unit_bytes, self.device)
            self.page_meta[:, idx] = self._raw_meta
        return ids.tolist()

    def free(self, page_ids: Sequence[int]) -> None:
        self.ledger.free(page_ids)

    def mark_full(self, page_ids: Sequence[int]) -> None:
        """Pages that filled; they are compressed (all layers) in the next ``end_step()``."""
        self.ledger.mark_full(page_ids)

    def reserve(self, request_id: str, max_new_pages: int) -> None:
        """Set how many more pages ``request_id`` may allocate; raises OutOfPages if that does not fit."""
        self.ledger.reserve(request_id, max_new_pages)

    def release(self, request_id: str) -> None:
        self.ledger.release(request_id)

    def headroom_pages(self) -> int:
        """New pages that fit in every layer after reservations (conservative, never optimistic)."""
        return self.ledger.headroom_pages()

    def poll(self) -> None:
        """Take in what finished on the device (sizes, drained chunks) without waiting; cheap."""
        self.ledger.poll()

    def settle(self) -> None:
        """Wait for the device's pending encodes and moves, then take them in (a sync: for reclaim only)."""
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.ledger.poll()
        self.settle_host_s += time.perf_counter() - t0

    def end_step(self) -> None:
        """Apply finished launches, issue one encode launch for all full pages, maybe compact. No sync."""
        t0 = time.perf_counter()
        self.ledger.poll()
        plan = self.ledger.plan_encode() if self.compression else None
        if plan is not None:
            with self.device_timers["encode"].span():
                self._launch_encode(plan)
        self._steps += 1
        if self.compression and self._steps % self.compaction_interval_steps == 0:
            self.compact()
        self.ledger.poll()
        self.end_step_host_s += time.perf_counter() - t0

    def take_timings(self) -> dict[str, float]:
        """Since the last take: device ms and span counts per DEVICE_SPANS name (completed spans only), and
        the host ms spent in end_step and waiting in settle."""
        out = {"end_step_host_ms": 1e3 * self.end_step_host_s, "settle_host_ms": 1e3 * self.settle_host_s}
        self.end_step_host_s = self.settle_host_s = 0.0
        for name, timer in self.device_timers.items():
            out[f"{name}_gpu_ms"], spans = timer.take()
            out[f"{name}_spans"] = float(spans)
        return out

    def compact(self, max_layers: int = 1, live_fraction: float | None = None) -> int:
        """Move live pages out of mostly-dead compressed chunks; returns (layer, page) pairs moved.
        ``live_fraction`` overrides the pool's threshold (a reclaim under pressure takes any chunk that
        frees room)."""
        move = self.ledger.plan_compaction(max_layers=max_layers, live_fraction=live_fraction)
        if move is None:
            return 0
        with self.device_timers["move"].span():
            self._launch_move(move)
        self.ledger.moved(move)
        self.compacted_pages += int(move.pages.size)
        return int(move.pages.size)

    # ---- device work -------------------------------------------------------------------------------
    def _launch_encode(self, plan: EncodePlan) -> None:
        dev, fmt, n, unit = self.device, self.fmt, plan.size, self.unit_bytes
        meta_out = torch.empty((n, fmt.page_heads_per_page, fmt.meta_bytes), dtype=torch.uint8, device=dev)
        sizes_out = torch.zeros(n, dtype=torch.int32, device=dev)
        stage = upload(plan.stage_units, dev)
        self.encoder(self.heap, upload(plan.src_units * unit, dev), stage * unit, meta_out, sizes_out, fmt)
        # Pack each region's pages one after another (the host repeats this with packed_units()).
        size_units = sizes_out.to(torch.int64) // unit
        excl = torch.cumsum(size_units, 0) - size_units
        segments, first = upload(plan.segments, dev), upload(plan.region_first, dev)
        dst = upload(plan.region_base_units, dev)[segments] + excl - excl[first][segments]
        if self._packer is None:
            raw_units = fmt.raw_page_bytes // unit
            self._packer = Packer(self._units, raw_units, self._slice_pages, self._scratch_unit)
        self._packer.pack(stage, dst, size_units, self.pack_impl)
        layers, pages = upload(plan.layers, dev), upload(plan.pages, dev)
        self.page_loc[layers, pages] = dst * unit
        self.page_meta[layers, pages] = meta_out
        if dev.type == "cuda":
            host = torch.empty(n, dtype=torch.int32, pin_memory=True)
            host.copy_(sizes_out, non_blocking=True)
        else:
            host = sizes_out
        self.ledger.launched(plan, self.ledger.new_fence(), host.numpy)

    def _launch_move(self, move: MovePlan) -> None:
        dev = self.device
        for lo in range(0, move.pages.size, self._slice_pages):
            sl = slice(lo, lo + self._slice_pages)
            sizes = move.size_units[sl]
            within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            src = upload(np.repeat(move.src_units[sl], sizes) + within, dev)
            dst = upload(np.repeat(move.dst_units[sl], sizes) + within, dev)
            self._units[dst] = self._units[src]
        layers, pages = upload(move.layers, dev), upload(move.pages, dev)
        self.page_loc[layers, pages] = upload(move.dst_units * self.unit_bytes, dev)

    # ---- reporting ---------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        led, unit = self.ledger, self.unit_bytes
        state = led.page_state
        compressed = state == PageState.COMPRESSED
        raw_units = int(compressed.sum()) * self.num_layers * led.raw
        stored_units = int(led.page_units[:, compressed].sum())
        log = led.chunk_kind == ChunkKind.LOG
        budget = led.cfg.num_chunks * led.cu * unit
        used = int(led.chunk_live.sum()) * unit
        return PoolStats(
            headroom_pages=led.headroom_pages(),
            used_pages=int((state != PageState.FREE).sum()),
            committed_pages=led.reserved_pages,
            raw_pages=int(((state == PageState.RAW) | (state == PageState.FULL)).sum()),
            compressed_pages=int(compressed.sum()),
            encoding_pages=int((state == PageState.ENCODING).sum()),
            used_bytes=used,
            free_bytes=budget - used,
            committed_bytes=led.reserved_pages * self.num_layers * self.fmt.raw_page_bytes,
            dead_bytes=int((led.chunk_bump[log] - led.chunk_live[log]).sum()) * unit,
            budget_bytes=budget,
            compression_ratio=stored_units / raw_units if raw_units else 1.0,
            pool_chunks=len(led.pool),
            # each block stored compressed saves exactly one unit of its page (unit_bytes_for); a v3 page
            # stored raw saves none, and none of its blocks is stored compressed
            compressed_blocks=raw_units - stored_units,
            compressed_page_blocks=raw_units * unit // self.fmt.raw_block_bytes,
        )

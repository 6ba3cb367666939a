"""Benchmark data for decode attention: KV pages, real or synthetic, stored packed.

Real pages (``--fractions real``, the default first entry) are SmolLM2-135M-Instruct's captured K and V
tiled to the benchmark's shape (bench/kernels/real_kv.py); the benches report the fraction of blocks that
coded on them. Synthetic pages (a number ``f``) are random normal bf16 with magnitudes clamped to [2^-9, 60),
so every 512-value block fits the format's exponent window, of which about ``1 - f`` of the blocks are then
made raw by planting one tiny value (1e-30, far below the window): a controlled fraction, not real KV. The
encoder here is a vectorised torch rendering of kernels/format/layout.py for token-major blocks (the bench
checks it byte for byte against zipkv.kernels.reference.pages.encode_page); page format v3's pages come from
kernels/reference/pages_v3.py's encoder (v3 blocks of 16 tokens x 4 pairs; synthetic raw blocks planted per v3
block). Either way pages are written back to back, as a compacted heap holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.kernels.real_kv import describe, tile_pages
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import BLOCK_VALUES, OFFSET_BYTES, PAGE_TOKENS, RAW_MARKER, PageFormat
from zipkv.kernels.reference.pages_v3 import encode_pages_v3

REAL = "real"  # the --fractions entry for pages of real KV
SYNTHETIC = "random normal bf16, |x| in [2^-9, 60); about 1 - f of the blocks made raw by a planted 1e-30"
_ROW_BYTES = 256  # every block size (768, 1024) and page size is a multiple of this
_TINY = 1e-30


def data_notes() -> dict[str, str]:
    """What "real" and "synthetic" pages are, for a bench's JSON record."""
    return {"real": describe(), "synthetic": SYNTHETIC}


def bench_pages(
    entry: str, num_pages: int, fmt: PageFormat, pages_per_request: int, gen: torch.Generator, device: str
) -> tuple[torch.Tensor, str]:
    """(bf16 ``[P, 2, H, 16, D]`` pages, "real" or "synthetic") for one ``--fractions`` entry: ``real``
    tiles the captured KV; a number is the fraction of synthetic blocks left compressible."""
    if entry == REAL:
        return tile_pages(num_pages, fmt.num_kv_heads, fmt.head_dim, pages_per_request, device), "real"
    pages = random_pages(num_pages, fmt, gen, device)
    plant_raw_blocks(pages, fmt, 1.0 - float(entry), gen)
    return pages, "synthetic"


def random_pages(num_pages: int, fmt: PageFormat, generator: torch.Generator, device: str) -> torch.Tensor:
    """bf16 ``[P, 2, H, 16, D]`` of random normal values whose every block is compressible."""
    out = torch.empty(
        num_pages, 2, fmt.num_kv_heads, PAGE_TOKENS, fmt.head_dim, dtype=torch.bfloat16, device=device
    )
    chunk = 4096
    for p0 in range(0, num_pages, chunk):
        x = torch.randn(out[p0 : p0 + chunk].shape, generator=generator, device=device)
        out[p0 : p0 + chunk] = (torch.sign(x) * x.abs().clamp(2.0**-9, 60.0)).to(torch.bfloat16)
    return out


def plant_raw_blocks(
    pages: torch.Tensor, fmt: PageFormat, raw_fraction: float, generator: torch.Generator
) -> torch.Tensor:
    """Make about ``raw_fraction`` of the blocks raw (in place); returns the planted first values to undo."""
    if fmt.version >= 3:  # v3: block G's first value is token 0, channel pair_of(G, 0) = 4G
        first = pages[:, :, :, 0, : fmt.head_dim // 2 : v3.BLOCK_PAIRS]  # [P, 2, H, D/8]
        saved = first.clone()
        pick = torch.rand(first.shape, generator=generator, device=pages.device) < raw_fraction
        first.copy_(torch.where(pick, torch.copysign(torch.full_like(first, _TINY), first), first))
        return saved
    rows = BLOCK_VALUES // fmt.head_dim
    first = pages[:, :, :, ::rows, 0]  # [P, 2, H, NB]: the first value of each block
    saved = first.clone()
    pick = torch.rand(first.shape, generator=generator, device=pages.device) < raw_fraction
    pages[:, :, :, ::rows, 0] = torch.where(pick, torch.copysign(torch.full_like(first, _TINY), first), first)
    return saved


@dataclass(frozen=True)
class StoredPages:
    heap: torch.Tensor  # uint8 [capacity]: the pages back to back from byte 0
    page_loc: torch.Tensor  # int64 [P]: byte offset of page p
    page_meta: torch.Tensor  # uint8 [P, 2H, meta_bytes]
    stored_bytes: int  # bytes of all pages (metadata excluded)
    compressible_fraction: float  # measured over the stored blocks

    @property
    def meta_bytes(self) -> int:
        return self.page_meta.numel()


def encode_packed(pages: torch.Tensor, fmt: PageFormat, heap: torch.Tensor | None = None) -> StoredPages:
    """Encode every page (token-major blocks; v3 through its reference) into one heap, pages back to back."""
    if fmt.version >= 3:
        return _encode_packed_v3(pages, fmt, heap)
    num_pages, _, h, _, d = pages.shape
    nb, rows, half = fmt.blocks_per_page_head, BLOCK_VALUES // d, d // 2
    if fmt.k_geometry.channels != d or fmt.v_geometry.channels != d:
        raise ValueError("the bench encoder handles token-major blocks only")
    device = pages.device
    if heap is None:
        heap = torch.empty(num_pages * fmt.raw_page_bytes, dtype=torch.uint8, device=device)
    heap_rows = heap.view(-1, _ROW_BYTES)
    loc = torch.empty(num_pages, dtype=torch.int64, device=device)
    meta = torch.zeros(num_pages, 2 * h, fmt.meta_bytes, dtype=torch.uint8, device=device)
    running = torch.zeros((), dtype=torch.int64, device=device)
    compressed = torch.zeros((), dtype=torch.int64, device=device)
    chunk = 2048
    for p0 in range(0, num_pages, chunk):
        blocks = pages[p0 : p0 + chunk].reshape(-1, 2 * h, nb, BLOCK_VALUES)
        n = blocks.shape[0]
        bits = blocks.view(torch.int16).to(torch.int32) & 0xFFFF
        exps = (bits >> 7) & 0xFF
        base = exps.amin(-1) & ~1
        comp = (exps.amax(-1) - base) < 16
        compressed += comp.sum()
        markers = torch.where(comp, base >> 1, RAW_MARKER).to(torch.uint8)
        sizes = torch.where(comp, 768, 1024).to(torch.int64).view(n, -1)
        in_page = torch.cumsum(sizes, 1) - sizes  # [n, 2H*NB] offset of each block in its page
        page_bytes = sizes.sum(1)
        page_off = running + torch.cumsum(page_bytes, 0) - page_bytes
        running = running + page_bytes.sum()
        loc[p0 : p0 + n] = page_off
        head_off = in_page.view(n, 2 * h, nb)[:, :, 0].to(torch.int32)
        meta[p0 : p0 + n, :, :OFFSET_BYTES] = head_off.unsqueeze(-1).view(torch.uint8).view(n, 2 * h, 4)
        meta[p0 : p0 + n, :, OFFSET_BYTES : OFFSET_BYTES + nb] = markers
        start_row = ((page_off[:, None] + in_page) // _ROW_BYTES).view(-1)
        comp = comp.view(-1)
        flat = bits.view(-1, rows, d)
        # compressed blocks: 512 low bytes, then code bytes pairing channel k with k + D/2
        cb = flat[comp]
        d_val = (((cb >> 7) & 0xFF) - base.view(-1)[comp][:, None, None]) >> 1
        sign = cb >> 15
        code = (
            (sign[..., :half] << 7) | (sign[..., half:] << 6) | (d_val[..., half:] << 3) | d_val[..., :half]
        )
        low = cb & 0xFF  # [m, rows, D]
        if fmt.paired_low_bytes:  # format v2: lo(t, k), lo(t, k + D/2) side by side
            low = torch.stack([low[..., :half], low[..., half:]], dim=-1)
        data = torch.cat([low.to(torch.uint8).reshape(-1, 512), code.to(torch.uint8).view(-1, 256)], 1)
        rows_c = start_row[comp]
        for i in range(3):
            heap_rows[rows_c + i] = data[:, i * _ROW_BYTES : (i + 1) * _ROW_BYTES]
        raw = blocks.reshape(-1, BLOCK_VALUES)[~comp].view(torch.uint8)
        rows_r = start_row[~comp]
        for i in range(4):
            heap_rows[rows_r + i] = raw[:, i * _ROW_BYTES : (i + 1) * _ROW_BYTES]
    total_blocks = num_pages * 2 * h * nb
    return StoredPages(heap, loc, meta, int(running), int(compressed) / total_blocks)


def _encode_packed_v3(pages: torch.Tensor, fmt: PageFormat, heap: torch.Tensor | None) -> StoredPages:
    """Page format v3: kernels/reference/pages_v3.py's encoder, its pages written back to back (every v3 page
    size is a multiple of 64 bytes, the 16-byte alignment the kernels need)."""
    num_pages, device = pages.shape[0], pages.device
    if heap is None:
        heap = torch.empty(num_pages * fmt.raw_page_bytes, dtype=torch.uint8, device=device)
    loc = torch.empty(num_pages, dtype=torch.int64, device=device)
    meta = torch.empty(num_pages, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=device)
    running, coded = 0, 0
    chunk = 2048
    for p0 in range(0, num_pages, chunk):
        stored, meta[p0 : p0 + chunk] = encode_pages_v3(pages[p0 : p0 + chunk], fmt)
        sizes = torch.tensor([s.numel() for s in stored], dtype=torch.int64)
        loc[p0 : p0 + len(stored)] = (running + torch.cumsum(sizes, 0) - sizes).to(device)
        data = torch.cat(stored)
        heap[running : running + data.numel()] = data
        running += data.numel()
        coded += int((meta[p0 : p0 + chunk] < v3.RAW_BLOCK_FLAG).sum())
    return StoredPages(heap, loc, meta, running, coded / (num_pages * fmt.blocks_per_page))

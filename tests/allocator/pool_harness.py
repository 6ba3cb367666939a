"""A small serving loop over a real PagePool on the CPU: requests append tokens, pages fill and are
compressed by the torch reference encoder, and a shadow copy of every token checks what the heap holds.
Pools are built at page format v2 (the default) or v3 (``FORMATS``; the ``fmt`` fixture runs a test at
both)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from zipkv.allocator import PagePool
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import OFFSET_BYTES, PAGE_TOKENS, RAW_MARKER, PageFormat
from zipkv.kernels.reference import pages as reference

FMT = PageFormat(head_dim=64, num_kv_heads=1, version=2)  # raw page 4 KiB (16 units of 256 B), 4 blocks
FMT_V3 = PageFormat(head_dim=64, num_kv_heads=1, version=3)  # raw page 4 KiB (64 units of 64 B), 16 blocks
FORMATS = (FMT, FMT_V3)
CHUNK_BYTES = 4 * FMT.raw_page_bytes
assert FMT_V3.raw_page_bytes == FMT.raw_page_bytes
KINDS = ("smooth", "zeros", "wide")  # compressible / exact zeros force raw blocks / exponent spread > 16


def coded_blocks(page_meta: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """bool [..., 2H, blocks]: which blocks of pages with metadata ``page_meta`` are stored compressed."""
    if fmt.version >= 3:
        return page_meta < v3.RAW_BLOCK_FLAG  # b/2; raw blocks are 0x80 | rank, raw pages 0xFF
    return page_meta[..., OFFSET_BYTES : OFFSET_BYTES + fmt.blocks_per_page_head] != RAW_MARKER


def make_pool(
    layers: int = 2,
    chunks: int = 24,
    shared_pool: bool = True,
    compression: bool = True,
    fmt: PageFormat = FMT,
    **kw: object,
) -> PagePool:
    return PagePool(
        fmt,
        layers,
        chunks * CHUNK_BYTES + 256,
        chunk_bytes=CHUNK_BYTES,
        shared_pool=shared_pool,
        compression=compression,
        **kw,
    )  # type: ignore[arg-type]


def token_values(kind: str, seed: int, n: int, fmt: PageFormat = FMT) -> torch.Tensor:
    """bf16 [n, 2, H, D] K and V of ``n`` tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, fmt.num_kv_heads, fmt.head_dim, generator=g)
    if kind == "zeros":
        x = torch.where(torch.rand(x.shape, generator=g) < 0.02, torch.zeros(()), x)
    elif kind == "wide":
        x = x * torch.exp2(torch.randint(-30, 30, x.shape, generator=g).float())
    return x.to(torch.bfloat16)


@dataclass
class Request:
    rid: str
    max_tokens: int
    kind: str
    tokens: int = 0
    pages: list[int] = field(default_factory=list)

    @property
    def max_pages(self) -> int:
        return -(-self.max_tokens // PAGE_TOKENS)


class Harness:
    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.running: dict[str, Request] = {}
        self.shadow: dict[tuple[int, int], torch.Tensor] = {}  # (layer, page) -> bf16 [16, 2, H, D]
        self.count = 0

    def admit(self, max_tokens: int, kind: str) -> Request | None:
        """Admit if capacity says it fits (reserving its whole length), else None."""
        req = Request(f"r{self.count}", max_tokens, kind)
        if self.pool.headroom_pages() < req.max_pages:
            return None
        self.pool.reserve(req.rid, req.max_pages)
        self.count += 1
        self.running[req.rid] = req
        return req

    def step(self, tokens: int) -> None:
        """Every running request appends up to ``tokens`` tokens; finished ones leave; one end_step."""
        slots, values, full = [], [], []
        for req in list(self.running.values()):
            n = min(tokens, req.max_tokens - req.tokens)
            need = -(-(req.tokens + n) // PAGE_TOKENS) - len(req.pages)
            if need:
                req.pages += self.pool.allocate(need, req.rid)  # must never fail for an admitted request
            vals = token_values(req.kind, zlib.crc32(f"{req.rid}/{req.tokens}".encode()), n, self.pool.fmt)
            for i in range(n):
                pos = req.tokens + i
                page = req.pages[pos // PAGE_TOKENS]
                slots.append(page * PAGE_TOKENS + pos % PAGE_TOKENS)
                values.append(vals[i])
                for layer in range(self.pool.num_layers):
                    shadow = self.shadow.setdefault(
                        (layer, page), torch.zeros(PAGE_TOKENS, *vals.shape[1:], dtype=torch.bfloat16)
                    )
                    shadow[pos % PAGE_TOKENS] = (vals[i].float() * 2.0**layer).to(
                        torch.bfloat16
                    )  # exact: layers differ
                if pos % PAGE_TOKENS == PAGE_TOKENS - 1:
                    full.append(page)
            req.tokens += n
        if slots:
            dev = self.pool.heap.device
            slot_t = torch.tensor(slots, dtype=torch.int64, device=dev)
            kv = torch.stack(values).to(dev)
            for layer in range(self.pool.num_layers):
                kv_l = (kv.float() * 2.0**layer).to(torch.bfloat16)
                reference.store_tokens(
                    self.pool.heap, self.pool.page_loc[layer], slot_t, kv_l[:, 0], kv_l[:, 1], self.pool.fmt
                )
        self.pool.mark_full(full)
        for req in [r for r in self.running.values() if r.tokens == r.max_tokens]:
            self.finish(req.rid)
        self.pool.end_step()

    def finish(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.pool.free(req.pages)
        self.pool.release(rid)
        for page in req.pages:
            for layer in range(self.pool.num_layers):
                self.shadow.pop((layer, page), None)

    def check_data(self) -> None:
        """Every live page of every layer reads back (raw or compressed) exactly as written."""
        for req in self.running.values():
            if not req.pages:
                continue
            ids = torch.tensor(req.pages, dtype=torch.int64, device=self.pool.heap.device)
            for layer in range(self.pool.num_layers):
                got = reference.gather_pages(
                    self.pool.heap, self.pool.page_loc[layer], self.pool.page_meta[layer], ids, self.pool.fmt
                )  # [n, 2, H, 16, D]
                got = got.permute(0, 3, 1, 2, 4).cpu()  # [n, 16, 2, H, D]
                for i, page in enumerate(req.pages):
                    filled = min(PAGE_TOKENS, req.tokens - i * PAGE_TOKENS)
                    want = self.shadow[(layer, page)][:filled]
                    assert torch.equal(got[i, :filled].view(torch.int16), want.view(torch.int16)), (
                        f"layer {layer} page {page} of {req.rid} does not read back"
                    )

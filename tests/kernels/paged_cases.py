"""Paged test cases shared by the decode and extend kernel tests: random pages, stored compressed (raw where
a block does not fit, and the last page of each request raw, its unwritten rows NaN) and stored all raw for
the uncompressed twin.

Page format v3 cases add what only v3 has: coded pages with raw blocks (patches at several ranks), a full
page stored raw among coded ones, and every other request's last page coded with finite garbage past its
length (the kernels must mask it, not rely on NaN)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zipkv.kernels.attention.decode import decode_attention, plan_decode
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import BLOCK_VALUES, FORMAT_VERSION, PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import pages as ref
from zipkv.kernels.reference import pages_v3 as ref3
from zipkv.kernels.reference.attention import decode_attention_reference


@dataclass
class Case:
    fmt: PageFormat
    q: torch.Tensor  # bf16 [B, Hq, D]
    pages: torch.Tensor  # bf16 [P, 2, H, 16, D] values by page id (tails hold NaN past kv_len)
    page_ids: torch.Tensor  # int32 [total]
    indptr: torch.Tensor  # int32 [B + 1]
    kv_lens: torch.Tensor  # int32 [B]
    heap: torch.Tensor  # uint8: full pages compressed (raw where a block does not fit), tails raw
    loc: torch.Tensor  # int64 [P]
    meta: torch.Tensor  # uint8 [P, 2H, meta_bytes]
    raw_heap: torch.Tensor  # uint8: every page raw
    raw_loc: torch.Tensor
    raw_meta: torch.Tensor

    def plan(self, **kw: object):  # type: ignore[no-untyped-def]
        return plan_decode(self.page_ids, self.indptr, self.kv_lens, self.fmt, self.q.shape[1], **kw)


def make_case(
    head_dim: int,
    kv_heads: int,
    group: int,
    kv_lens: list[int],
    device: str,
    raw_fraction: float = 0.3,
    seed: int = 0,
    version: int = FORMAT_VERSION,
) -> Case:
    g = torch.Generator().manual_seed(seed)
    fmt = PageFormat(head_dim, kv_heads, version=version)
    counts = [-(-n // PAGE_TOKENS) for n in kv_lens]
    num_pages = sum(counts) + 2  # two pages nobody owns
    pages = torch.randn(num_pages, 2, kv_heads, PAGE_TOKENS, head_dim, generator=g).to(torch.bfloat16)
    if version < 3:
        rows = BLOCK_VALUES // head_dim
        pick = torch.rand(num_pages, 2, kv_heads, PAGE_TOKENS // rows, generator=g) < raw_fraction
        firsts = pages[:, :, :, ::rows, 1]
        pages[:, :, :, ::rows, 1] = torch.where(pick, torch.full_like(firsts, 1e-30), firsts)  # forces raw
    order = torch.randperm(num_pages, generator=g).tolist()
    ids, tails, start = [], {}, 0
    for n, c in zip(kv_lens, counts, strict=True):
        ids += order[start : start + c]
        start += c
        tails[ids[-1]] = n - (c - 1) * PAGE_TOKENS  # tokens in the last page
    if version >= 3:
        heap, loc, meta = _store_v3(pages, ids, tails, fmt, raw_fraction, g)
        raw_heap = pages.contiguous().view(torch.uint8).reshape(-1)  # v3 raw pages: plain [2, H, 16, D]
        raw_meta = ref3.raw_page_meta_v3(fmt).expand(num_pages, -1, -1).contiguous()
    else:
        heap, loc, meta = _store_v1_v2(pages, tails, fmt)
        raw_heap = torch.cat([ref.raw_page_bytes(p, fmt) for p in pages])
        raw_meta = ref.raw_page_meta(fmt).expand(num_pages, -1, -1).contiguous()
    raw_loc = torch.arange(num_pages, dtype=torch.int64) * fmt.raw_page_bytes
    q = torch.randn(len(kv_lens), kv_heads * group, head_dim, generator=g).to(torch.bfloat16)
    moved = [t.to(device) for t in (q, pages, heap, loc, meta, raw_heap, raw_loc, raw_meta)]

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    indptr = i32([0, *torch.tensor(counts).cumsum(0).tolist()])
    return Case(fmt, moved[0], moved[1], i32(ids), indptr, i32(kv_lens), *moved[2:])


def _store_v1_v2(
    pages: torch.Tensor, tails: dict[int, int], fmt: PageFormat
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(heap, loc, meta) of v1/v2 pages: tails raw with NaN past their length (written into ``pages``)."""
    num_pages = pages.shape[0]
    for pid, used in tails.items():
        pages[pid, :, :, used:] = float("nan")  # not yet written: must never reach the output
    stored, metas = [], []
    for pid in range(num_pages):
        if pid in tails:
            stored.append(ref.raw_page_bytes(pages[pid], fmt))
            metas.append(ref.raw_page_meta(fmt))
        else:
            data, m = ref.encode_page(pages[pid], fmt)
            stored.append(data)
            metas.append(m)
    return _place(stored, torch.stack(metas))


def _store_v3(
    pages: torch.Tensor, ids: list[int], tails: dict[int, int], fmt: PageFormat, raw_fraction: float,
    g: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(heap, loc, meta) of v3 pages (values written into ``pages``): a fraction of blocks forced raw (one
    value 1e-30 in one of a block's 8 channels), one owned full page (of two or more) forced raw in every
    block (stored raw), tails alternately raw with NaN past their length and coded with finite garbage."""
    num_pages, kv_heads, head_dim = pages.shape[0], fmt.num_kv_heads, fmt.head_dim
    nb = head_dim // 8
    pick = torch.rand(num_pages, 2, kv_heads, nb, generator=g) < raw_fraction
    full = [pid for pid in ids if pid not in tails]
    if len(full) > 1 and raw_fraction > 0:
        pick[full[0]] = True  # every block raw: the page is stored raw
    token = torch.randint(0, PAGE_TOKENS, pick.shape, generator=g)
    j = torch.randint(0, 8, pick.shape, generator=g)  # which of the block's 8 channels
    pairs = torch.tensor([[v3.pair_of(block, i) for i in range(4)] for block in range(nb)])
    channel = pairs[torch.arange(nb).expand_as(j), j % 4] + (j // 4) * (head_dim // 2)
    at = pick.nonzero(as_tuple=True)
    pages[(*at[:3], token[at], channel[at])] = 1e-30
    raw_tails = set()
    for n, (pid, used) in enumerate(tails.items()):
        if n % 2 == 0:
            pages[pid, :, :, used:] = float("nan")  # not yet written: must never reach the output
            raw_tails.add(pid)
        else:
            garbage = torch.randn(2, kv_heads, PAGE_TOKENS - used, head_dim, generator=g) * 4
            pages[pid, :, :, used:] = garbage.to(torch.bfloat16)
    stored, meta = ref3.encode_pages_v3(pages, fmt)
    for pid in raw_tails:
        stored[pid] = pages[pid].contiguous().view(torch.uint8).reshape(-1)
        meta[pid] = ref3.raw_page_meta_v3(fmt)
    return _place(stored, meta)


def _place(stored: list[torch.Tensor], meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stored pages into one heap, at increasing offsets with gaps (pages need not be adjacent)."""
    heap = torch.zeros(sum(d.numel() + 256 for d in stored) + 4096, dtype=torch.uint8)
    loc = torch.empty(len(stored), dtype=torch.int64)
    offset = 512
    for pid, data in enumerate(stored):
        heap[offset : offset + data.numel()] = data
        loc[pid] = offset
        offset += data.numel() + 256
    return heap, loc, meta


def assert_mixed(case: Case) -> None:
    """The case exercises every kind of stored unit its format has (else a test could pass vacuously)."""
    if case.fmt.version >= 3:
        owned = case.meta.cpu()[case.page_ids.cpu().long()].to(torch.int32)
        assert (owned < v3.RAW_BLOCK_FLAG).any(), "no coded block"
        assert ((owned >= v3.RAW_BLOCK_FLAG) & (owned != v3.RAW_PAGE_MARKER)).any(), "no raw block"
        assert (owned.flatten(1) == v3.RAW_PAGE_MARKER).all(dim=1).any(), "no page stored raw"
        ranks = owned[(owned >= v3.RAW_BLOCK_FLAG) & (owned != v3.RAW_PAGE_MARKER)] & 0x7F
        assert int(ranks.max()) > 0, "every raw block reads patch 0"
    else:
        markers = ref.unpack_meta(case.meta.cpu(), case.fmt)[1]
        assert (markers == 0xFF).any() and (markers != 0xFF).any(), "the case must mix raw and compressed"


def run_both(case: Case, plan, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    scale = case.fmt.head_dim**-0.5
    packed = decode_attention(plan, case.q, case.heap, case.loc, case.meta, scale, **kw)
    twin = decode_attention(plan, case.q, case.raw_heap, case.raw_loc, case.raw_meta, scale, compressed=False)
    return packed, twin


def rel_err(case: Case, out: torch.Tensor) -> float:
    scale = case.fmt.head_dim**-0.5
    exp = decode_attention_reference(
        case.q, case.pages, case.page_ids, case.indptr, case.kv_lens.cpu(), scale
    )
    return float((out.double() - exp).norm() / exp.norm())

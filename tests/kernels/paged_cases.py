"""Paged test cases shared by the decode and extend kernel tests: random pages, stored compressed (raw where
a block does not fit, and the last page of each request raw, its unwritten rows NaN) and stored all raw for
the uncompressed twin."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zipkv.kernels import reference as ref
from zipkv.kernels.decode_attention import decode_attention, plan_decode
from zipkv.kernels.layout import BLOCK_VALUES, FORMAT_VERSION, PAGE_TOKENS, PageFormat
from zipkv.kernels.reference_attention import decode_attention_reference


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
    for pid, used in tails.items():
        pages[pid, :, :, used:] = float("nan")  # not yet written: must never reach the output
    heap = torch.zeros(num_pages * fmt.raw_page_bytes + 4096, dtype=torch.uint8)
    loc = torch.empty(num_pages, dtype=torch.int64)
    meta = torch.empty(num_pages, 2 * kv_heads, fmt.meta_bytes, dtype=torch.uint8)
    offset = 512
    for pid in range(num_pages):
        if pid in tails:
            data, m = ref.raw_page_bytes(pages[pid], fmt), ref.raw_page_meta(fmt)
        else:
            data, m = ref.encode_page(pages[pid], fmt)
        heap[offset : offset + data.numel()] = data
        loc[pid], meta[pid] = offset, m
        offset += data.numel() + 256  # a gap: pages need not be adjacent
    raw_loc = torch.arange(num_pages, dtype=torch.int64) * fmt.raw_page_bytes
    raw_heap = torch.cat([ref.raw_page_bytes(p, fmt) for p in pages])
    raw_meta = ref.raw_page_meta(fmt).expand(num_pages, -1, -1).contiguous()
    q = torch.randn(len(kv_lens), kv_heads * group, head_dim, generator=g).to(torch.bfloat16)
    moved = [t.to(device) for t in (q, pages, heap, loc, meta, raw_heap, raw_loc, raw_meta)]

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    indptr = i32([0, *torch.tensor(counts).cumsum(0).tolist()])
    return Case(fmt, moved[0], moved[1], i32(ids), indptr, i32(kv_lens), *moved[2:])


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

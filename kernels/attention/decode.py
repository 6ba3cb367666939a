"""Fused paged decode attention over compressed pages (one query token per request).

Each program handles one (work item, KV head), a work item being one split of one request's context
(decode_plan.py): all ``Hq / H`` query heads of the KV head at once
(padded to 16 rows so ``tl.dot`` applies), so every K/V tile is read and restored once. A tile is
``BLOCK_N`` tokens; each token row of a page-head sits in one block (token-major blocks, format/layout.py),
which is either compressed (restored to BF16 in registers right before the dot products) or raw. The choice
is made per row without a branch: raw rows load bf16 and compressed rows load low bytes and codes
through masked loads, and the restore selects per value (kernels/attention/tiles.py). Nothing is
decompressed to device memory. Page format v3 (format/layout_v3.py) has blocks of 16 tokens x 4 channel pairs,
so a row's blocks lie side by side: its page is read raw or coded per row, and each coded value restored or
patched per block (kernels/attention/tiles_v3.py); kernels/attention/kv_tiles.py picks the format's loads.

Restore (format/layout.py): a code byte pairs channel ``k`` with ``k + D/2`` of the same token, so the two
head_dim halves come out as two ``[BLOCK_N, D/2]`` tiles, one dot product each. On the GPU four values
are restored per 32-bit register with masks, one byte-wise add of ``b/2``, two ``prmt`` byte
interleaves and a ``lop3`` select of raw pairs (``tl.inline_asm_elementwise``, pack=4); under the
interpreter a plain-integer path does the same per value.

Plan/run split (kernels/attention/decode_plan.py): the batch's split-KV metadata is built once per step and
reused by every layer; when batch x KV heads cannot fill the GPU each request's context is cut into splits
whose partial outputs a second small kernel merges by log-sum-exp.

``compressed=False`` is the uncompressed twin: the same kernel source with a constexpr switch that reads
every page as a raw page (no metadata). On pages holding the same values the two return bit-identical
outputs: the restored tiles are the same bits, and everything after them is the same code.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..format.layout import PageFormat
from .decode_plan import DecodePlan, plan_decode
from .kv_tiles import _kv_rows, _load_kv_tiles
from .merge import merge_splits
from .prefetch import _attend_prefetched
from .tiles import _attend_tile, _start_rows

__all__ = ["DecodePlan", "decode_attention", "plan_decode"]

_LOG2E = 1.4426950408889634
_MIN_DOT_ROWS = 16


@triton.jit
def _program_work(pid, work_ptr, NUM_KV_HEADS: tl.constexpr):
    """The (work item, KV head) program ``pid`` handles, and the item's request (-1: idle), first and end
    token and the request's first page index (split_plan.work_items); heads fastest."""
    pair = pid // NUM_KV_HEADS
    row = work_ptr + pair * 4
    return pair, pid % NUM_KV_HEADS, tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3)


@triton.jit
def _store_rows(out_ptr, o_part_ptr, lse_part_ptr, m_i, l_i, acc_a, acc_b, req, q_head, pair,
                stride_ob, stride_oh, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
                HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """The program's GROUP rows: the final bf16 output, or (SPLIT) this split's fp32 partial and
    log2-sum-exp2 for the merge."""
    HALF: tl.constexpr = HEAD_DIM // 2
    g = tl.arange(0, G_PAD)
    ch = tl.arange(0, HALF)[None, :]
    q_mask = (g < GROUP)[:, None]
    out_a = acc_a / l_i[:, None]
    out_b = acc_b / l_i[:, None]
    if not SPLIT:
        o_rows = out_ptr + req * stride_ob + q_head[:, None] * stride_oh
        tl.store(o_rows + ch, out_a.to(tl.bfloat16), mask=q_mask)
        tl.store(o_rows + HALF + ch, out_b.to(tl.bfloat16), mask=q_mask)
    else:
        part = pair * NUM_KV_HEADS * GROUP + q_head  # [G_PAD]: o_partial [pairs, Hq, D]
        tl.store(o_part_ptr + part[:, None] * HEAD_DIM + ch, out_a, mask=q_mask)
        tl.store(o_part_ptr + part[:, None] * HEAD_DIM + HALF + ch, out_b, mask=q_mask)
        tl.store(lse_part_ptr + part, m_i + tl.log2(l_i), mask=g < GROUP)


@triton.jit
def _decode_kernel(
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr,
    heap_u8, heap_bf16, page_loc_ptr, meta32_ptr,
    page_ids_ptr, work_ptr,
    qk_scale, stride_qb, stride_qh, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, COMPRESSED: tl.constexpr, USE_ASM: tl.constexpr,
    FP32_DOT: tl.constexpr, PREFETCH: tl.constexpr, PAIRED: tl.constexpr, V3: tl.constexpr,
):  # fmt: skip
    pair, head, req, first, end, page_base = _program_work(tl.program_id(0), work_ptr, NUM_KV_HEADS)
    if req >= 0:
        g = tl.arange(0, G_PAD)
        q_head = head * GROUP + g
        q_rows = q_ptr + req * stride_qb + q_head[:, None] * stride_qh
        q_mask = (g < GROUP)[:, None]
        q_a, q_b, m_i, l_i, acc_a, acc_b = _start_rows(q_rows, q_mask, G_PAD, HEAD_DIM, FP32_DOT)

        offs_n = tl.arange(0, BLOCK_N)
        tok = first + offs_n
        # Row addresses run one tile ahead: page table -> page location -> metadata is a chain of
        # dependent loads that would otherwise stall every tile before its data loads can start.
        k_start, k_marker, v_start, v_marker = _kv_rows(
            tok, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED, V3,
        )  # fmt: skip
        if PREFETCH and COMPRESSED:  # register double-buffering (attention/prefetch.py)
            m_i, l_i, acc_a, acc_b = _attend_prefetched(
                q_a, q_b, m_i, l_i, acc_a, acc_b, qk_scale, first, end, page_base, head,
                k_start, k_marker, v_start, v_marker, heap_u8, heap_bf16, page_ids_ptr, page_loc_ptr,
                meta32_ptr, NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, BLOCK_N, USE_ASM, FP32_DOT,
                PAIRED, V3,
            )  # fmt: skip
        else:
            for tile in range(first, end, BLOCK_N):
                tok = tile + offs_n
                valid = tok < end
                k_a, k_b, v_a, v_b = _load_kv_tiles(
                    heap_u8, heap_bf16, meta32_ptr, k_start, k_marker, v_start, v_marker, tok, valid, head,
                    NUM_KV_HEADS, HEAD_DIM, COMPRESSED, USE_ASM, FP32_DOT, PAIRED, V3,
                )  # fmt: skip
                nxt = tok + BLOCK_N
                k_start, k_marker, v_start, v_marker = _kv_rows(
                    nxt, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
                    NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED, V3,
                )  # fmt: skip
                m_i, l_i, acc_a, acc_b = _attend_tile(
                    q_a, q_b, k_a, k_b, v_a, v_b, valid[None, :], m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT
                )

        _store_rows(out_ptr, o_part_ptr, lse_part_ptr, m_i, l_i, acc_a, acc_b, req, q_head, pair,
                    stride_ob, stride_oh, NUM_KV_HEADS, GROUP, G_PAD, HEAD_DIM, SPLIT)  # fmt: skip


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launch_options(
    q: torch.Tensor, out: torch.Tensor | None, use_asm: bool | None
) -> tuple[torch.Tensor, bool, bool]:
    """(out, use_asm, interpret) for a launch: a checked or new bf16 output like ``q``, and the restore path
    (PTX on the GPU, plain integers under the interpreter, where PTX cannot run)."""
    interpret = _interpreting()
    use_asm = not interpret if use_asm is None else use_asm
    if use_asm and interpret:
        raise ValueError("the PTX restore cannot run under TRITON_INTERPRET=1; pass use_asm=False")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != torch.bfloat16 or out.stride(-1) != 1:
        raise ValueError(
            f"out must be bf16 {list(q.shape)} with unit last stride, got {out.dtype} {list(out.shape)}"
        )
    return out, use_asm, interpret


def check_pages(fmt: PageFormat, heap: torch.Tensor, page_loc: torch.Tensor, page_meta: torch.Tensor) -> None:
    """One layer's pool tensors as the kernels read them: clear errors instead of wrong reads."""
    if heap.dtype != torch.uint8 or heap.dim() != 1 or heap.numel() % 4 != 0:
        raise ValueError(
            f"heap must be a 1-D uint8 tensor of a multiple of 4 bytes, got {heap.dtype} {list(heap.shape)}"
        )
    if page_loc.dtype != torch.int64 or page_loc.dim() != 1:
        raise ValueError(
            f"page_loc_layer must be int64 [max_pages], got {page_loc.dtype} {list(page_loc.shape)}"
        )
    want_meta = (page_loc.numel(), fmt.page_heads_per_page, fmt.meta_bytes)
    if page_meta.dtype != torch.uint8 or tuple(page_meta.shape) != want_meta or not page_meta.is_contiguous():
        raise ValueError(
            f"page_meta_layer must be contiguous uint8 {list(want_meta)}, "
            f"got {page_meta.dtype} {list(page_meta.shape)}"
        )


def check_one_device(*tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _check_inputs(
    plan: DecodePlan, q: torch.Tensor, heap: torch.Tensor, page_loc: torch.Tensor, page_meta: torch.Tensor
) -> None:
    fmt = plan.fmt
    want_q = (plan.batch_size, plan.num_q_heads, fmt.head_dim)
    if q.dtype != torch.bfloat16 or tuple(q.shape) != want_q or q.stride(-1) != 1:
        raise ValueError(
            f"q must be bf16 {list(want_q)} with unit last stride, got {q.dtype} {list(q.shape)}"
        )
    check_pages(fmt, heap, page_loc, page_meta)
    check_one_device(q, heap, page_loc, page_meta, plan.page_ids, plan.kv_lens)


def kernel_constexprs(
    fmt: PageFormat, group: int, block_n: int, split: bool, compressed: bool, use_asm: bool,
    fp32_dot: bool, prefetch: bool,
) -> dict[str, object]:  # fmt: skip
    """The decode kernel's compile-time arguments, as every launch passes them
    (bench/kernels/kernel_resources.py compiles the kernel offline from the same)."""
    return dict(
        NUM_KV_HEADS=fmt.num_kv_heads, GROUP=group, G_PAD=max(_MIN_DOT_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=fmt.head_dim, BLOCK_N=block_n, SPLIT=split, META_WORDS=fmt.meta_bytes // 4,
        BLOCKS_PER_HEAD=fmt.blocks_per_page_head, COMPRESSED=compressed, USE_ASM=use_asm, FP32_DOT=fp32_dot,
        PREFETCH=prefetch, PAIRED=fmt.paired_low_bytes, V3=fmt.fixed_stride,
    )  # fmt: skip


def decode_attention(
    plan: DecodePlan,
    q: torch.Tensor,
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    sm_scale: float,
    compressed: bool = True,
    out: torch.Tensor | None = None,
    use_asm: bool | None = None,
) -> torch.Tensor:
    """bf16 ``[B, Hq, D]`` attention output of ``q`` (bf16 ``[B, Hq, D]``) over one layer's pages.

    ``compressed=False`` runs the uncompressed twin (every page read as raw). ``use_asm`` picks the
    restore path (default: PTX on the GPU, plain integers under the interpreter).
    """
    _check_inputs(plan, q, heap, page_loc_layer, page_meta_layer)
    if plan.impl == "hopper":  # imported here: its Gluon module needs the GPU machine's Triton
        from .hopper.launch import decode_attention_hopper

        return decode_attention_hopper(
            plan, q, heap, page_loc_layer, page_meta_layer, sm_scale, compressed, out, plan.num_stages
        )
    fmt = plan.fmt
    out, use_asm, interpret = launch_options(q, out, use_asm)
    group = plan.group_size
    grid = (plan.num_pairs * fmt.num_kv_heads,)
    _decode_kernel[grid](
        q, out, plan.o_partial, plan.lse_partial,
        heap, heap.view(torch.bfloat16), page_loc_layer, page_meta_layer.view(torch.int32),
        plan.page_ids, plan.work,
        sm_scale * _LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        **kernel_constexprs(
            fmt, group, plan.block_n, plan.max_splits > 1, compressed, use_asm, interpret, plan.prefetch
        ),
        num_warps=plan.num_warps, num_stages=plan.num_stages if compressed else plan.twin_num_stages,
    )  # fmt: skip
    if plan.max_splits > 1:
        merge_splits(plan, out)
    return out

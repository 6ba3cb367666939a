"""The split-KV merge of the fused decode kernels (kernels/attention/decode.py, attention/hopper/).

When the plan cuts a request's context into splits, each split writes a partial output and its
log2-sum-exp2; this small kernel combines them. At batch 1 the merge is on the critical path (a request
of 8192 tokens has 66 splits): the first version, one program per (request, query head) walking the splits
16 at a time in two passes, took 10 us there against the attention's 17 us (ncu, H200), a chain of
dependent loads on 32 of 132 SMs. So: one online pass, a whole chunk of splits (up to 128) loaded at
once, and the head dimension spread over programs, so batch 1 x 32 heads is 128 programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_plan import DecodePlan

MAX_CHUNK_SPLITS = 128  # splits loaded at once: a [128, D_BLOCK] fp32 tile, 32 values per thread
MIN_CHUNK_SPLITS = 16
D_BLOCK = 32  # head-dim columns per program


@triton.jit
def _merge_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, num_splits_ptr, pair_start_ptr, stride_ob, stride_oh,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, D_BLOCK: tl.constexpr,
    SKIP_WHOLE: tl.constexpr,
):  # fmt: skip
    """Combine D_BLOCK columns of one (request, query head)'s split outputs by their log2-sum-exp2; the
    request's splits are consecutive work items (o_partial [pairs, Hq, D], lse_partial [pairs, Hq]).
    SKIP_WHOLE: a request of one split has its output already (the decode kernel wrote it): no store."""
    req = tl.program_id(0)
    q_head = tl.program_id(1)
    n = tl.load(num_splits_ptr + req)
    if SKIP_WHOLE:
        n = tl.where(n > 1, n, 0)  # one split: its row is written already; nothing to load or store
    first = tl.load(pair_start_ptr + req)
    offs = tl.arange(0, CHUNK)
    d = tl.program_id(2) * D_BLOCK + tl.arange(0, D_BLOCK)
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), 0)
    den = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    acc = tl.zeros([D_BLOCK], tl.float32)
    for s0 in range(0, n, CHUNK):
        live = s0 + offs < n
        part = (first + s0 + offs) * NUM_Q_HEADS + q_head
        lse = tl.load(lse_part_ptr + part, mask=live, other=float("-inf"))
        o = tl.load(o_part_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        # Every split holds tokens, so m_new is finite from the first chunk on; exp2(-inf) = 0 drops the
        # empty carry of the first iteration.
        rescale = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * rescale + tl.sum(w[:, None] * o, 0)
        den = den * rescale + tl.sum(w, 0)
        m = m_new
    keep = tl.zeros([D_BLOCK], tl.int32) < n  # all or none: none for a skipped whole request
    tl.store(out_ptr + req * stride_ob + q_head * stride_oh + d, (acc / den).to(tl.bfloat16), mask=keep)


def merge_shape(plan: DecodePlan) -> tuple[int, int]:
    """(splits loaded at once, head-dim columns a program). By default up to the plan's most splits, so
    batch 1's 66 splits are one load, and 32 columns a program, so batch 1 x 32 heads still fills 128
    programs. With even shares (split_plan.program_items) ``max_splits`` is only a bound, the program count,
    while a request holds a few items, and the batch is large (the rule takes 34 requests and more): the
    least chunk and the whole head a program (a quarter of the programs at head_dim 128), each loading its
    few rows once. With the 128-split chunk at 32 columns, the even-shares launch spent 11-13 us more
    outside its kernel's span than the plan's own launch (H100, docs/benchmarks.md). A request of more
    items than a chunk takes the loop."""
    head_dim = plan.fmt.head_dim
    if plan.program_items is not None:
        return MIN_CHUNK_SPLITS, head_dim
    chunk = max(MIN_CHUNK_SPLITS, min(MAX_CHUNK_SPLITS, triton.next_power_of_2(plan.max_splits)))
    return chunk, min(D_BLOCK, head_dim)


def merge_splits(plan: DecodePlan, out: torch.Tensor, skip_whole: bool = False) -> None:
    """Merge ``plan``'s partial outputs (``plan.o_partial``, ``plan.lse_partial``) into bf16 ``out``
    ``[B, Hq, D]``; launched by both decode wrappers after a split run. ``skip_whole``: requests of one
    split wrote ``out`` themselves (the Hopper kernel) and are left as they are."""
    head_dim = plan.fmt.head_dim
    chunk, d_block = merge_shape(plan)
    _merge_kernel[(plan.batch_size, plan.num_q_heads, head_dim // d_block)](
        plan.o_partial, plan.lse_partial, out, plan.num_splits, plan.pair_start, out.stride(0), out.stride(1),
        NUM_Q_HEADS=plan.num_q_heads, HEAD_DIM=head_dim, CHUNK=chunk, D_BLOCK=d_block, SKIP_WHOLE=skip_whole,
        num_warps=4,
    )  # fmt: skip

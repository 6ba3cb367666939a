"""Fused paged extend attention: new tokens over their cached prefix, read from compressed pages, and
causally over themselves.

A prefill that finds part of its prompt already cached (a radix-cache hit, the next chunk of a chunked
prefill) attends to that prefix where it lives: in the pool's pages, compressed or raw. Each K/V tile of
the prefix is read and restored to BF16 in registers exactly as the decode kernel does it
(kernels/attention/kv_tiles.py, every page format version), so no prefix page is decompressed to device
memory. The new tokens' own K/V come from the forward pass's dense ``k``/``v``, causally masked.

One program per (block of ``BLOCK_M`` new tokens of one request, KV head): its rows are every query head of
the KV head for each of those tokens (``BLOCK_M x G_PAD`` rows), so each restored tile feeds all of them.

``compressed=False`` is the uncompressed twin (every prefix page read as raw); on pages holding the same
values both return bit-identical outputs, as in decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..env_choice import env_choice
from ..format.layout import PAGE_TOKENS, PageFormat
from .decode import _LOG2E, _MIN_DOT_ROWS, check_one_device, check_pages, launch_options
from .decode_plan import require_token_major
from .kv_tiles import _kv_rows, _load_kv_tiles
from .tiles import _attend_tile, _start_rows

EXTEND_KERNEL_ENV = "ZIPKV_EXTEND_KERNEL"
EXTEND_KERNELS = ("restore", "fused")


def extend_kernel_choice() -> str:
    """How an extend with a cached prefix reads it (``$ZIPKV_EXTEND_KERNEL``): ``restore`` (default, measured
    on the H200): the prefix pages restored into a scratch buffer, then SGLang's Triton extend kernel;
    ``fused``: kernels/attention/extend.py reads the pages compressed, restoring tiles in registers."""
    return env_choice(EXTEND_KERNEL_ENV, EXTEND_KERNELS, "restore")


@dataclass(frozen=True)
class ExtendPlan:
    """One extend step's metadata, shared by every layer (tensors on the KV device)."""

    fmt: PageFormat
    num_q_heads: int
    qo_indptr: torch.Tensor  # int32 [B + 1]: request b's new tokens are rows qo_indptr[b]:qo_indptr[b + 1]
    prefix_lens: torch.Tensor  # int32 [B]: cached tokens before them
    page_ids: torch.Tensor  # int32 [total prefix pages]: each request's prefix pages, in token order
    page_indptr: torch.Tensor  # int32 [B + 1]: request b's prefix pages are page_ids[page_indptr[b]:...]
    block_req: torch.Tensor  # int32 [num_blocks]: the request of each program's query block
    block_first: torch.Tensor  # int32 [num_blocks]: the block's first new token, counted within its request
    block_m: int  # new tokens per program
    block_n: int  # keys per tile
    num_warps: int

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.fmt.num_kv_heads


def plan_extend(
    qo_lens: list[int],
    prefix_lens: list[int],
    page_ids: torch.Tensor,
    page_counts: list[int],
    fmt: PageFormat,
    num_q_heads: int,
    block_m: int | None = None,
    block_n: int = 32,
    num_warps: int | None = None,
) -> ExtendPlan:
    """Plan an extend batch: request b has ``qo_lens[b]`` new tokens after ``prefix_lens[b]`` cached ones
    held in the next ``page_counts[b]`` pages of ``page_ids`` (int32/int64 [sum(page_counts)], on the KV
    device). The lengths are host lists, so planning never waits for the device."""
    if not len(qo_lens) == len(prefix_lens) == len(page_counts) or page_ids.numel() != sum(page_counts):
        raise ValueError(
            f"{len(qo_lens)} requests need as many prefix lengths and page counts ({len(prefix_lens)}, "
            f"{len(page_counts)}), and {sum(page_counts)} page ids ({page_ids.numel()})"
        )
    if num_q_heads % fmt.num_kv_heads != 0:
        raise ValueError(f"{num_q_heads} query heads do not group over {fmt.num_kv_heads} KV heads")
    require_token_major(fmt, "extend attention")
    if min(qo_lens, default=1) < 1 or min(prefix_lens, default=0) < 0:
        raise ValueError(f"every request needs >= 1 new token and a prefix >= 0: {qo_lens}, {prefix_lens}")
    short = [
        b for b, (n, p) in enumerate(zip(prefix_lens, page_counts, strict=True)) if -(-n // PAGE_TOKENS) > p
    ]
    if short:
        raise ValueError(f"requests {short}: prefix longer than their pages hold")
    g_pad = triton.next_power_of_2(num_q_heads // fmt.num_kv_heads)
    if block_m is None:
        block_m = max(64 // g_pad, 1)
    if block_m & (block_m - 1) or block_m * g_pad < _MIN_DOT_ROWS or block_n & (block_n - 1) or block_n < 16:
        raise ValueError(
            f"block_m ({block_m}) must be a power of two with block_m x {g_pad} >= {_MIN_DOT_ROWS} rows, "
            f"block_n ({block_n}) a power of two >= 16"
        )
    if num_warps is None:  # 64 rows of fp32 accumulators: head_dim 256 spills on 4 warps (sm_90 compile)
        num_warps = 8 if fmt.head_dim >= 256 else 4
    blocks = [(b, m) for b, n in enumerate(qo_lens) for m in range(0, n, block_m)]
    device = page_ids.device

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    def offsets(counts: list[int]) -> torch.Tensor:
        return i32([0, *torch.tensor(counts, dtype=torch.int64).cumsum(0).tolist()])

    return ExtendPlan(
        fmt, num_q_heads, offsets(qo_lens), i32(prefix_lens), page_ids.to(torch.int32), offsets(page_counts),
        i32([b for b, _ in blocks]), i32([m for _, m in blocks]), block_m, block_n, num_warps,
    )  # fmt: skip


@triton.jit
def _dense_kv_tile(k_ptr, v_ptr, row, ok, head, stride_kt, stride_kh, stride_vt, stride_vh,
                   HEAD_DIM: tl.constexpr):  # fmt: skip
    """K and V of this pass's tokens ``row`` (rows of the dense [T, H, D] tensors), channels < D/2 and
    >= D/2 apart as the attention takes them; 0 where not ``ok``."""
    HALF: tl.constexpr = HEAD_DIM // 2
    ch = tl.arange(0, HALF)[None, :]
    kv_row = row.to(tl.int64)[:, None]
    k_rows = k_ptr + kv_row * stride_kt + head * stride_kh
    v_rows = v_ptr + kv_row * stride_vt + head * stride_vh
    k_a = tl.load(k_rows + ch, mask=ok[:, None], other=0.0)
    k_b = tl.load(k_rows + HALF + ch, mask=ok[:, None], other=0.0)
    v_a = tl.load(v_rows + ch, mask=ok[:, None], other=0.0)
    v_b = tl.load(v_rows + HALF + ch, mask=ok[:, None], other=0.0)
    return k_a, k_b, v_a, v_b


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, heap_u8, heap_bf16, page_loc_ptr, meta32_ptr,
    page_ids_ptr, page_indptr_ptr, prefix_lens_ptr, qo_indptr_ptr, block_req_ptr, block_first_ptr, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, META_WORDS: tl.constexpr, BLOCKS_PER_HEAD: tl.constexpr,
    COMPRESSED: tl.constexpr, USE_ASM: tl.constexpr, FP32_DOT: tl.constexpr, PAIRED: tl.constexpr,
    V3: tl.constexpr,
):  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    ROWS: tl.constexpr = BLOCK_M * G_PAD
    blk, head = tl.program_id(0), tl.program_id(1)  # a block of new tokens, a KV head
    req = tl.load(block_req_ptr + blk)
    first = tl.load(block_first_ptr + blk)
    qo_start = tl.load(qo_indptr_ptr + req)
    new_len = tl.load(qo_indptr_ptr + req + 1) - qo_start
    prefix_len = tl.load(prefix_lens_ptr + req)
    page_base = tl.load(page_indptr_ptr + req)

    r = tl.arange(0, ROWS)
    q_tok = first + r // G_PAD  # each row's new token (within the request) and query head
    g = r % G_PAD
    q_head = head * GROUP + g
    row_ok = (q_tok < new_len) & (g < GROUP)
    ch = tl.arange(0, HALF)[None, :]
    q_rows = q_ptr + (qo_start + q_tok).to(tl.int64)[:, None] * stride_qt + q_head[:, None] * stride_qh
    q_a, q_b, m_i, l_i, acc_a, acc_b = _start_rows(q_rows, row_ok[:, None], ROWS, HEAD_DIM, FP32_DOT)
    offs_n = tl.arange(0, BLOCK_N)

    # The cached prefix, from its pages: every new token sees all of it.
    for tile in range(0, prefix_len, BLOCK_N):
        tok = tile + offs_n
        valid = tok < prefix_len
        k_start, k_marker, v_start, v_marker = _kv_rows(
            tok, prefix_len, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED, V3,
        )  # fmt: skip
        k_a, k_b, v_a, v_b = _load_kv_tiles(
            heap_u8, heap_bf16, meta32_ptr, k_start, k_marker, v_start, v_marker, tok, valid, head,
            NUM_KV_HEADS, HEAD_DIM, COMPRESSED, USE_ASM, FP32_DOT, PAIRED, V3,
        )  # fmt: skip
        m_i, l_i, acc_a, acc_b = _attend_tile(
            q_a, q_b, k_a, k_b, v_a, v_b, valid[None, :], m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT
        )

    # The new tokens, from this pass's dense K/V: token j is seen by tokens j and after.
    for tile in range(0, tl.minimum(new_len, first + BLOCK_M), BLOCK_N):
        j = tile + offs_n
        j_ok = j < new_len
        k_a, k_b, v_a, v_b = _dense_kv_tile(
            k_ptr, v_ptr, qo_start + j, j_ok, head, stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM
        )
        causal = j_ok[None, :] & (j[None, :] <= q_tok[:, None])
        m_i, l_i, acc_a, acc_b = _attend_tile(
            q_a, q_b, k_a, k_b, v_a, v_b, causal, m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT
        )

    o_rows = out_ptr + (qo_start + q_tok).to(tl.int64)[:, None] * stride_ot + q_head[:, None] * stride_oh
    tl.store(o_rows + ch, (acc_a / l_i[:, None]).to(tl.bfloat16), mask=row_ok[:, None])
    tl.store(o_rows + HALF + ch, (acc_b / l_i[:, None]).to(tl.bfloat16), mask=row_ok[:, None])


def extend_constexprs(plan: ExtendPlan, compressed: bool, use_asm: bool, fp32_dot: bool) -> dict[str, object]:
    """The extend kernel's compile-time arguments (bench/kernels/kernel_resources.py compiles from them)."""
    fmt, group = plan.fmt, plan.group_size
    return dict(
        NUM_KV_HEADS=fmt.num_kv_heads, GROUP=group, G_PAD=triton.next_power_of_2(group),
        HEAD_DIM=fmt.head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, META_WORDS=fmt.meta_bytes // 4,
        BLOCKS_PER_HEAD=fmt.blocks_per_page_head, COMPRESSED=compressed, USE_ASM=use_asm, FP32_DOT=fp32_dot,
        PAIRED=fmt.paired_low_bytes, V3=fmt.fixed_stride,
    )  # fmt: skip


def _check(plan: ExtendPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    fmt = plan.fmt
    tokens = q.shape[0]
    want = {"q": (tokens, plan.num_q_heads, fmt.head_dim), "k": (tokens, fmt.num_kv_heads, fmt.head_dim)}
    want["v"] = want["k"]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.bfloat16 or tuple(t.shape) != want[name] or t.stride(-1) != 1:
            raise ValueError(
                f"{name} must be bf16 {list(want[name])} with unit last stride, got {t.dtype} {list(t.shape)}"
            )
    if plan.block_req.numel() and int(plan.qo_indptr[-1]) != tokens:
        raise ValueError(f"the plan covers {int(plan.qo_indptr[-1])} new tokens, q has {tokens}")


def extend_attention(
    plan: ExtendPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    sm_scale: float,
    compressed: bool = True,
    out: torch.Tensor | None = None,
    use_asm: bool | None = None,
) -> torch.Tensor:
    """bf16 ``[N, Hq, D]`` attention of the new tokens ``q`` (bf16 ``[N, Hq, D]``; ``k``/``v``: bf16
    ``[N, H, D]``) over their prefix pages in one layer and, causally, over themselves."""
    _check(plan, q, k, v)
    check_pages(plan.fmt, heap, page_loc_layer, page_meta_layer)
    check_one_device(q, k, v, heap, page_loc_layer, page_meta_layer, plan.page_ids)
    out, use_asm, interpret = launch_options(q, out, use_asm)
    if plan.block_req.numel() == 0:
        return out
    grid = (plan.block_req.numel(), plan.fmt.num_kv_heads)
    _extend_kernel[grid](
        q, k, v, out, heap, heap.view(torch.bfloat16), page_loc_layer, page_meta_layer.view(torch.int32),
        plan.page_ids, plan.page_indptr, plan.prefix_lens, plan.qo_indptr, plan.block_req, plan.block_first,
        sm_scale * _LOG2E, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), **extend_constexprs(plan, compressed, use_asm, interpret),
        num_warps=plan.num_warps,
    )  # fmt: skip
    return out

"""Hopper (sm_90) fused decode attention over page format v3, in Gluon (Triton 3.6's explicit layer).

One program handles one (work item, KV head), a work item being one split of one request's context
(attention/split_plan.py), all ``Hq / H`` query heads of the KV head at once (16 MMA rows); with even
shares (split_plan.program_items) a program runs its share's items in turn. Its pages stream from global
to shared memory in a ring of ``STAGES`` tiles (``cp.async``, one commit group per tile of ``NP`` pages),
so the next tiles' bytes are in flight while this one is restored and multiplied. Per page the producer
copies exactly what is stored (kernels/format/layout_v3.py): a coded page's lo plane, code plane and the
patches of its raw blocks, or a raw page's bf16; the tile's metadata goes with them. Page table and
metadata reads run one tile ahead of the copies they steer.

Three ways through a tile, chosen per tile (uniform across the program):
- all pages coded, all tokens valid (the common case): a pre-pass turns every coded block's code words
  into high-byte pairs (``(c & 0x87878787) + b/2`` and its twin for channels ``p + D/2``: eight values per
  two words; raw blocks take theirs from the code slot and the patch), written where the codes were, in
  the lo plane's order. Then both planes load straight into the MMA fragments with ``ldmatrix`` and four
  ``prmt`` per eight values interleave low and high bytes into bf16 pairs. No restored bf16 tile goes
  through shared memory.
- all pages raw, all tokens valid (new pages, incompressible data, the uncompressed twin): bf16 loads
  straight into the fragments, nothing else.
- anything else (the tile holding a request's last, partly written page; a tile mixing raw and coded
  pages): every value is gathered and restored from global memory in the fragment layout; rare, slower.
All three hand bit-identical operands to the same attention code, so a compressed page and a raw page
holding the same values give bit-identical outputs (compression on and off give identical tokens).

Layout (kernels/attention/hopper/layouts.py): S = Q_a K_a^T + Q_b K_b^T with ``_a`` channels ``p < D/2`` and
``_b`` channels ``p + D/2`` (the pairs one v3 code byte holds); O_a += P V_a, O_b += P V_b. Split-KV and the
plan come from kernels/attention/decode_plan.py; partial outputs merge in kernels/attention/merge.py. The
launch, and the compile-time arguments it shares with the offline compile, are in launch.py beside this.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .epilogue import store_out
from .lean import lean_scratch
from .restore import tile_operands
from .ring import _PT, KIND_BITS, issue_tile, tile_ids, tile_info
from .softmax import _M, attend_tile, final_state, init_state, kernel_mma_layout, out_layout
from .stamps import stamp
from .warp_softmax import load_q_pages

LOG2E = 1.4426950408889634


@gluon.jit
def _load_q(q_ptr, req, head, stride_qb, stride_qh, GROUP: ttgl.constexpr, D: ttgl.constexpr):
    """The KV head's GROUP query rows (padded to 16), channels < D/2 and >= D/2, as loaded (both loads go
    out before either is turned into MMA operands: :func:`_q_operands`)."""
    ld_l: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [2, 16], [ttgl.num_warps(), 1], [1, 0])
    offs_m = ttgl.arange(0, _M, layout=ttgl.SliceLayout(1, ld_l))
    offs_d = ttgl.arange(0, D // 2, layout=ttgl.SliceLayout(0, ld_l))
    q_rows = q_ptr + req * stride_qb + (head * GROUP + offs_m)[:, None] * stride_qh + offs_d[None, :]
    q_mask = (offs_m < GROUP)[:, None]
    return ttgl.load(q_rows, mask=q_mask, other=0.0), ttgl.load(q_rows + D // 2, mask=q_mask, other=0.0)


@gluon.jit
def _q_operands(q_rows, a_l: ttgl.constexpr):
    """The loaded query rows as MMA A operands. The layout change goes through shared memory with CTA
    barriers, which nothing is moved across: done before the ring's table loads, it made a program's
    start wait for the query (two round trips, one per half) before its page ids went out."""
    return ttgl.convert_layout(q_rows[0], a_l), ttgl.convert_layout(q_rows[1], a_l)


@gluon.jit
def _item_work(item, work_ptr):
    """Work item ``item``'s request (-1: idle), first and end token and first page index. The four scalars
    are one row (attention/split_plan.py) and load together, before the idle test: a load behind it would
    wait for it (a round trip to memory that, under a full DRAM, costs microseconds a program pays before
    its first tile)."""
    row = work_ptr + item * 4
    return ttgl.load(row), ttgl.load(row + 1), ttgl.load(row + 2), ttgl.load(row + 3)


@gluon.jit
def item_start(item, work_ptr, num_splits_ptr, SPLIT: ttgl.constexpr):
    """:func:`_item_work`'s four scalars and the request's split count (1 without SPLIT). The count is
    loaded now and tested at the end (a test here would wait on the load): a request of one split is
    whole, the count the merge reads to skip it."""
    req, first, end, page_base = _item_work(item, work_ptr)
    req_splits = 1
    if SPLIT:
        req_splits = ttgl.load(num_splits_ptr + ttgl.maximum(req, 0))
    return req, first, end, page_base, req_splits


@gluon.jit
def _ring(STAGES: ttgl.constexpr, NP: ttgl.constexpr, D: ttgl.constexpr):
    """The ring's shared memory: per stage and KV side, the A and B buffers and the block markers
    (ring.py's docstring). Plain row-major; the stage dimension is indexed away before any view."""
    plain2: ttgl.constexpr = ttgl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    plain3: ttgl.constexpr = ttgl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    a_k = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D, 16], plain3)
    b_k = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D, 16], plain3)
    a_v = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D, 16], plain3)
    b_v = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D, 16], plain3)
    m_k = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D // 8], plain2)
    m_v = ttgl.allocate_shared_memory(ttgl.uint8, [STAGES, NP, D // 8], plain2)
    return a_k, b_k, a_v, b_v, m_k, m_v


@gluon.jit
def _slot(ring, s):
    """Stage ``s`` of the ring: (a_k, b_k, a_v, b_v, m_k, m_v), what issue_tile and tile_operands take."""
    a_k, b_k, a_v, b_v, m_k, m_v = ring
    return a_k.index(s), b_k.index(s), a_v.index(s), b_v.index(s), m_k.index(s), m_v.index(s)


@gluon.jit
def _fill_ring(ring, heap_ptr, tables, first, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
               STAGES: ttgl.constexpr, GATHER_ALL: ttgl.constexpr, LEAN: ttgl.constexpr):  # fmt: skip
    """Tiles 0 .. STAGES-2 in flight before the loop. Returns ``kinds`` (each in-flight tile's read path,
    KIND_BITS apiece), the table loads of the loop's first copies and the page ids of the tile after.

    Page ids run two tiles ahead of the copies, the loads they steer one tile ahead. Every table load that
    does not depend on another goes out first, so a program's first copies wait for two round trips (page
    ids, then locations and markers), not one per tile."""
    N: ttgl.constexpr = NP * _PT
    tok_n = first + (STAGES - 1) * N
    ids_0 = tile_ids(tables, first, D, NP)
    ids_n = tile_ids(tables, tok_n, D, NP)
    ids_nn = tile_ids(tables, tok_n + N, D, NP)
    info_0 = tile_info(tables, first, ids_0, H, D, NP)
    kinds = 0
    for s0 in ttgl.static_range(STAGES - 1):
        tok_s0 = first + s0 * N
        if s0 == 0:  # noqa: SIM108 (a constexpr test: Gluon unrolls this loop)
            info_s0 = info_0
        else:
            info_s0 = tile_info(tables, tok_s0, tile_ids(tables, tok_s0, D, NP), H, D, NP)
        if s0 == STAGES - 2:  # the loop's first tile's loads go out before this tile's copies wait
            info_n = tile_info(tables, tok_n, ids_n, H, D, NP)
        kind0 = issue_tile(_slot(ring, s0), heap_ptr, tables, tok_s0, info_s0, H, D, NP, GATHER_ALL, LEAN)
        kinds = kinds | (kind0 << (KIND_BITS * s0))
        async_copy.commit_group()
    return kinds, info_n, ids_nn


@gluon.jit
def _refill(ring, i, kinds, info_n, ids_nn, heap_ptr, tables, first, H: ttgl.constexpr, D: ttgl.constexpr,
            NP: ttgl.constexpr, STAGES: ttgl.constexpr, GATHER_ALL: ttgl.constexpr,
            LEAN: ttgl.constexpr):  # fmt: skip
    """While tile ``i`` is restored and multiplied: tile i + STAGES - 1's copies into the slot tile i - 1
    freed (steered by ``info_n``), the table loads of the tile after it, the page ids of the one after
    that. Returns the three carried the same way."""
    N: ttgl.constexpr = NP * _PT
    nxt = i + STAGES - 1
    kind_n = issue_tile(
        _slot(ring, nxt % STAGES), heap_ptr, tables, first + nxt * N, info_n, H, D, NP, GATHER_ALL, LEAN
    )
    kinds = kinds | (kind_n << (KIND_BITS * (STAGES - 1)))
    async_copy.commit_group()
    tok_n = first + (nxt + 1) * N
    info_n = tile_info(tables, tok_n, ids_nn, H, D, NP)
    ids_nn = tile_ids(tables, tok_n + N, D, NP)
    return kinds, info_n, ids_nn


@gluon.jit
def _attend_item(item, head, ring, scratch, io, glob, tabs, qk_scale, strides,
                 H: ttgl.constexpr, GROUP: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
                 STAGES: ttgl.constexpr, SPLIT: ttgl.constexpr, GATHER_ALL: ttgl.constexpr,
                 OP_K: ttgl.constexpr, OP_V: ttgl.constexpr, CW: ttgl.constexpr, HW: ttgl.constexpr,
                 PG1: ttgl.constexpr, WARP_SOFTMAX: ttgl.constexpr, LAZY_RESCALE: ttgl.constexpr,
                 LEAN: ttgl.constexpr, PAD_HI: ttgl.constexpr, TIMING: ttgl.constexpr, timing_ptr, pid,
                 FIRST_STAMP: ttgl.constexpr = 1):  # fmt: skip
    """Work item ``item`` for KV head ``head``: its tiles through the ring, its rows or partial written.
    ``io``: (q, out, o_partial, lse_partial) pointers; ``tabs``: (page_ids, page_loc, meta, work,
    num_splits); ``strides``: (q batch, q head, out batch, out head). TIMING: stamp ``FIRST_STAMP`` when
    the first tile has landed (0: none)."""
    N: ttgl.constexpr = NP * _PT
    mma: ttgl.constexpr = kernel_mma_layout(ttgl.num_warps(), WARP_SOFTMAX)
    a_l: ttgl.constexpr = ttgl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    o_l: ttgl.constexpr = out_layout(mma, WARP_SOFTMAX)
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr = io
    page_ids_ptr, page_loc_ptr, meta_ptr, work_ptr, num_splits_ptr = tabs
    stride_qb, stride_qh, stride_ob, stride_oh = strides
    heap_ptr = glob[0]
    req, first, end, page_base, req_splits = item_start(item, work_ptr, num_splits_ptr, SPLIT)
    if req >= 0:
        n_tiles = (end - first + N - 1) // N
        tables = (page_ids_ptr, page_loc_ptr, meta_ptr, page_base, end, head)
        if WARP_SOFTMAX:
            q_rows = load_q_pages(q_ptr, req, head, stride_qb, stride_qh, _M, GROUP, D)
        else:
            q_rows = _load_q(q_ptr, req, head, stride_qb, stride_qh, GROUP, D)
        kinds, info_n, ids_nn = _fill_ring(ring, heap_ptr, tables, first, H, D, NP, STAGES, GATHER_ALL, LEAN)
        qa, qb = _q_operands(q_rows, a_l)  # while the first tiles' copies are in flight
        state = init_state(mma, N, D, WARP_SOFTMAX)
        for i in range(n_tiles):
            async_copy.wait_group(STAGES - 2)
            ttgl.thread_barrier()  # tile i landed for every thread; slot (i - 1) % STAGES is free again
            if TIMING and FIRST_STAMP != 0:  # noqa: SIM102 (constexpr: only in the TIMING build)
                if i == 0:
                    stamp(timing_ptr, pid, FIRST_STAMP)
            kinds, info_n, ids_nn = _refill(
                ring, i, kinds, info_n, ids_nn, heap_ptr, tables, first, H, D, NP, STAGES, GATHER_ALL, LEAN
            )
            tok0 = first + i * N
            ops = tile_operands(
                kinds & 7, _slot(ring, i % STAGES), glob, tables, tok0, OP_K, OP_V, CW, HW, PG1, H, D, NP,
                mma, LEAN,
            )  # fmt: skip
            kinds = kinds >> KIND_BITS
            state = attend_tile(qa, qb, ops, tok0, end, state, qk_scale, mma, a_l, N, WARP_SOFTMAX,
                                LAZY_RESCALE, scratch, LEAN, PAD_HI)  # fmt: skip
        async_copy.wait_group(0)
        m_i, l_i, acc_a, acc_b = final_state(state, mma, WARP_SOFTMAX)
        whole = req_splits == 1
        store_out(out_ptr, o_part_ptr, lse_part_ptr, m_i, l_i, acc_a, acc_b, req, head, item, whole,
                  stride_ob, stride_oh, ttgl.SliceLayout(1, o_l), ttgl.SliceLayout(0, o_l), H, GROUP, D,
                  SPLIT)  # fmt: skip


@gluon.jit
def _decode_hopper_kernel(
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr, heap_ptr, heap16_ptr, page_loc_ptr, meta_ptr,
    page_ids_ptr, work_ptr, num_splits_ptr, program_items_ptr, qk_scale, stride_qb, stride_qh, stride_ob,
    stride_oh, timing_ptr,
    H: ttgl.constexpr, GROUP: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
    STAGES: ttgl.constexpr, SPLIT: ttgl.constexpr, GATHER_ALL: ttgl.constexpr,
    OP_K: ttgl.constexpr, OP_V: ttgl.constexpr, CW: ttgl.constexpr, HW: ttgl.constexpr, PG1: ttgl.constexpr,
    WARP_SOFTMAX: ttgl.constexpr = False, TIMING: ttgl.constexpr = False,
    LAZY_RESCALE: ttgl.constexpr = False, LEAN: ttgl.constexpr = False, PX: ttgl.constexpr = None,
    EVEN_SHARES: ttgl.constexpr = False, PAD_HI: ttgl.constexpr = False,
):  # fmt: skip
    """Program ``pid`` = (program, KV head), heads fastest: one work item, or (EVEN_SHARES) the program's
    items ``program_items[program] ..`` in turn (split_plan.program_items). Its first two items each get a
    copy of the item's code of their own: inside a loop over items, ptxas leaves the Q fragments out of
    the registers the MMAs read them from and copies them in every tile (643 instructions a coded tile
    against 602, bench/kernels/hopper_resources.py --even-shares); items past two (requests shorter than
    a program's share) take the loop."""
    pid = ttgl.program_id(0)
    if TIMING:
        stamp(timing_ptr, pid, 0)
    ring = _ring(STAGES, NP, D)
    scratch = lean_scratch(_M, NP * _PT, PX) if LEAN else None
    io = (q_ptr, out_ptr, o_part_ptr, lse_part_ptr)
    tabs = (page_ids_ptr, page_loc_ptr, meta_ptr, work_ptr, num_splits_ptr)
    strides = (stride_qb, stride_qh, stride_ob, stride_oh)
    glob = (heap_ptr, heap16_ptr)
    head = pid % H
    if EVEN_SHARES:
        items_first = ttgl.load(program_items_ptr + pid // H)
        items_end = ttgl.load(program_items_ptr + pid // H + 1)
        for k in ttgl.static_range(2):
            if items_first + k < items_end:
                ttgl.thread_barrier()  # every warp has read the last item's last tile: the ring refills
                if TIMING and k == 1:
                    stamp(timing_ptr, pid, 4)
                _attend_item(items_first + k, head, ring, scratch, io, glob, tabs, qk_scale, strides, H,
                             GROUP, D, NP, STAGES, SPLIT, GATHER_ALL, OP_K, OP_V, CW, HW, PG1, WARP_SOFTMAX,
                             LAZY_RESCALE, LEAN, PAD_HI, TIMING, timing_ptr, pid, 1 + 4 * k)  # fmt: skip
        for item in range(items_first + 2, items_end):
            ttgl.thread_barrier()
            _attend_item(item, head, ring, scratch, io, glob, tabs, qk_scale, strides, H, GROUP, D, NP,
                         STAGES, SPLIT, GATHER_ALL, OP_K, OP_V, CW, HW, PG1, WARP_SOFTMAX, LAZY_RESCALE, LEAN,
                         PAD_HI, TIMING, timing_ptr, pid, 0)  # fmt: skip
    else:
        _attend_item(pid // H, head, ring, scratch, io, glob, tabs, qk_scale, strides, H, GROUP, D, NP,
                     STAGES, SPLIT, GATHER_ALL, OP_K, OP_V, CW, HW, PG1, WARP_SOFTMAX, LAZY_RESCALE, LEAN,
                     PAD_HI, TIMING, timing_ptr, pid)  # fmt: skip
    if TIMING:
        stamp(timing_ptr, pid, 2)

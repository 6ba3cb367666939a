"""The Hopper decode kernel with a producer partition (``ttgl.warp_specialize``): the same tiles, restore and
attention as decode.py, but the page-table loads and the ``cp.async`` copies run on warps of their own.

Why: on the H200 the kernel is bound by its warps' instruction issue (docs/benchmarks.md), and a quarter of a
coded tile's instructions are producer work (copies 91, table loads 52 of ~550 at head_dim 128). Here the
four consumer warps (the default partition) only wait, restore, multiply and release; four producer warps
(a worker partition: Triton pads a worker to a warpgroup, so all four take a page each) load the tables one
tile ahead and copy into the ring. A program is eight warps; capped at 128 registers a thread, two run on an
SM (eight consumer warps, as four two-warp programs of decode.py), and ``setmaxnreg`` moves the producer
warps' unused registers to the consumers.

Synchronisation, per ring slot: ``ready`` (count: one arrival per producer thread, each made by
``cp.async.mbarrier.arrive.noinc`` once its own copies of the tile have landed) and ``empty`` (count 1:
Gluon's ``mbarrier.arrive`` is a partition barrier, then one elected thread arrives). The consumers decide
how to read a landed tile from the block markers the producer copied with it (a raw page's are 0xFF), the
same bytes the producer decided from, so no other word crosses between the partitions.

PREPASS (``$ZIPKV_HOPPER_PRODUCER=2``): the producer warps also run each coded tile's pre-pass (codes to
high-byte pairs, restore._prepass) once its copies have landed, and arrive on ``ready`` once (count 1) after
it, so the consumers only load operands, multiply and take the softmax (199 SASS instructions a coded tile
against 387 without, offline). The producer finishes one tile before it waits for the next one's slot.

Scope (checked by the launch): the shared softmax, one work item per program (no even shares), tiles of one
page per consumer warp. Off by default (``$ZIPKV_HOPPER_PRODUCER``) until measured on a GPU.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier

from .decode import _item_work, _load_q, _q_operands, _ring, _slot, item_start
from .epilogue import store_out
from .lean import lean_scratch
from .restore import _prepass, prepass_layout, tile_operands
from .ring import _PT, CODED, EMPTY, GATHER, RAW, issue_tile, meta_layout, tile_ids, tile_info
from .softmax import _M, attend_tile, final_state, init_state, kernel_mma_layout

PRODUCER_WARPS = 4  # a worker partition is padded to a warpgroup anyway: every warp copies a page
PRODUCER_MAXNREG = 128  # registers a thread at launch: two programs of eight warps an SM
PRODUCER_REGS = 56  # registers a producer thread keeps (setmaxnreg); the consumers get the rest
PRODUCER_REGS_PREPASS = 104  # with the pre-pass: its code words and high bytes, ~40 more a thread
_PW = ttgl.constexpr(PRODUCER_WARPS)  # Gluon reads globals only as constexpr
_PREGS = ttgl.constexpr(PRODUCER_REGS)
_PREGS_PREPASS = ttgl.constexpr(PRODUCER_REGS_PREPASS)


@gluon.jit
def _copy_marks(m_dst, meta_ptr, pm, ph, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr):
    """The tile's block markers of page-head ``ph`` into the slot (``pm``: the page ids, meta layout)."""
    mt_l: ttgl.constexpr = meta_layout(D, NP, ttgl.num_warps())
    b = ttgl.arange(0, D // 8, layout=ttgl.SliceLayout(0, mt_l))[None, :]
    async_copy.async_copy_global_to_shared(
        m_dst, meta_ptr + pm[:, None] * (2 * H * (D // 8)) + b + ph * (D // 8)
    )


@gluon.jit
def _finish_tile(ring, ready, s, kind, CW: ttgl.constexpr, HW: ttgl.constexpr, D: ttgl.constexpr,
                 NP: ttgl.constexpr, LEAN: ttgl.constexpr):  # fmt: skip
    """PREPASS: the producer's last step of the tile in slot ``s`` once its copies have landed: a coded
    tile's pre-pass (restore._prepass, the consumers' otherwise), then one arrival on ``ready``."""
    _, b_k, _, b_v, m_k, m_v = _slot(ring, s)
    async_copy.wait_group(0)  # this thread's copies of the tile (the next tile's are not issued yet)
    ttgl.thread_barrier()  # every producer thread's
    if kind == CODED:
        pre_l: ttgl.constexpr = prepass_layout(D, NP, ttgl.num_warps())
        _prepass(b_k, m_k, b_v, m_v, pre_l, CW, HW, D, NP, True, LEAN)
    mbarrier.arrive(ready.index(s))


@gluon.jit
def _produce(ring, ready, empty, heap_ptr, tabs, item, head, H: ttgl.constexpr, D: ttgl.constexpr,
             NP: ttgl.constexpr, STAGES: ttgl.constexpr, GATHER_ALL: ttgl.constexpr, LEAN: ttgl.constexpr,
             CW: ttgl.constexpr, HW: ttgl.constexpr, PREPASS: ttgl.constexpr):  # fmt: skip
    """The producer partition: the item's tiles into the ring, each once its slot is released. A full tile
    that is not coded still gets K's markers (the consumers read how to take it from them); a coded one
    gets both sides' (issue_tile). Table loads run one tile ahead of the copies, page ids two. GATHER_ALL
    (a test mode, as decode.py's): nothing but markers is copied, every tile is gathered. PREPASS: a tile
    is handed over after its pre-pass (:func:`_finish_tile`), done while the next tile's slot frees."""
    N: ttgl.constexpr = NP * _PT
    page_ids_ptr, page_loc_ptr, meta_ptr, work_ptr = tabs
    req, first, end, page_base = _item_work(item, work_ptr)
    if req >= 0:
        n_tiles = (end - first + N - 1) // N
        tables = (page_ids_ptr, page_loc_ptr, meta_ptr, page_base, end, head)
        info = tile_info(tables, first, tile_ids(tables, first, D, NP), H, D, NP)
        ids_n = tile_ids(tables, first + N, D, NP)
        kind = n_tiles * 0 + EMPTY  # (a tensor: the loop carries the last tile's kind)
        for i in range(n_tiles):
            s = i % STAGES
            if PREPASS and i > 0:
                _finish_tile(ring, ready, (i + STAGES - 1) % STAGES, kind, CW, HW, D, NP, LEAN)
            # slot s is free once the consumers released it (not before its first use)
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1, pred=i >= STAGES)
            tok0 = first + i * N
            slot = _slot(ring, s)
            kind = issue_tile(slot, heap_ptr, tables, tok0, info, H, D, NP, GATHER_ALL, LEAN)
            if kind != CODED and tok0 + N <= end:
                _copy_marks(slot[4], meta_ptr, info[5], head, H, D, NP)
            if PREPASS:
                async_copy.commit_group()
            else:
                async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
            info = tile_info(tables, tok0 + N, ids_n, H, D, NP)
            ids_n = tile_ids(tables, tok0 + 2 * N, D, NP)
        if PREPASS and n_tiles > 0:
            _finish_tile(ring, ready, (n_tiles - 1) % STAGES, kind, CW, HW, D, NP, LEAN)


@gluon.jit
def _landed_kind(m_k, tok0, end, NP: ttgl.constexpr, GATHER_ALL: ttgl.constexpr):
    """How the consumers read a landed tile: GATHER if it is partial, else CODED / RAW / GATHER (mixed) by its
    pages' first K markers (0xFF: a raw page), as ring._tile_kind decided from the same bytes in memory."""
    kind = GATHER
    if not GATHER_ALL and tok0 + NP * _PT <= end:
        every_l: ttgl.constexpr = ttgl.BlockedLayout([NP, 1], [1, 32], [1, ttgl.num_warps()], [0, 1])
        raw = (m_k.slice(0, 1, dim=1).load(every_l) == 0xFF).to(ttgl.int32)
        # any and all, not a count: two compare chains, no adds (the count took 20 SASS instructions)
        if ttgl.max(ttgl.max(raw, axis=1), axis=0) == 0:
            kind = CODED
        elif ttgl.min(ttgl.min(raw, axis=1), axis=0) == 1:
            kind = RAW
    return kind


@gluon.jit
def _consume(ring, ready, empty, scratch, io, glob, tabs, item, head, qk_scale, strides,
             H: ttgl.constexpr, GROUP: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
             STAGES: ttgl.constexpr, SPLIT: ttgl.constexpr, GATHER_ALL: ttgl.constexpr,
             OP_K: ttgl.constexpr, OP_V: ttgl.constexpr, CW: ttgl.constexpr, HW: ttgl.constexpr,
             PG1: ttgl.constexpr, LEAN: ttgl.constexpr, PAD_HI: ttgl.constexpr,
             PREPASS: ttgl.constexpr):  # fmt: skip
    """The default partition: decode.py's _attend_item with the ring's waits on ``ready`` and a release of
    each slot on ``empty`` once its operands are in registers (PREPASS: coded tiles come pre-passed)."""
    N: ttgl.constexpr = NP * _PT
    mma: ttgl.constexpr = kernel_mma_layout(ttgl.num_warps(), False)
    a_l: ttgl.constexpr = ttgl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr, num_splits_ptr = io
    page_ids_ptr, page_loc_ptr, meta_ptr, work_ptr = tabs
    stride_qb, stride_qh, stride_ob, stride_oh = strides
    req, first, end, page_base, req_splits = item_start(item, work_ptr, num_splits_ptr, SPLIT)
    if req >= 0:
        n_tiles = (end - first + N - 1) // N
        tables = (page_ids_ptr, page_loc_ptr, meta_ptr, page_base, end, head)
        qa, qb = _q_operands(_load_q(q_ptr, req, head, stride_qb, stride_qh, GROUP, D), a_l)
        state = init_state(mma, N, D, False)
        for i in range(n_tiles):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            tok0 = first + i * N
            slot = _slot(ring, s)
            kind = _landed_kind(slot[4], tok0, end, NP, GATHER_ALL)
            ops = tile_operands(
                kind, slot, glob, tables, tok0, OP_K, OP_V, CW, HW, PG1, H, D, NP, mma, LEAN, PREPASS
            )
            mbarrier.arrive(empty.index(s))
            state = attend_tile(qa, qb, ops, tok0, end, state, qk_scale, mma, a_l, N, False, False, scratch,
                                LEAN, PAD_HI)  # fmt: skip
        m_i, l_i, acc_a, acc_b = final_state(state, mma, False)
        store_out(out_ptr, o_part_ptr, lse_part_ptr, m_i, l_i, acc_a, acc_b, req, head, item,
                  req_splits == 1, stride_ob, stride_oh, ttgl.SliceLayout(1, mma), ttgl.SliceLayout(0, mma),
                  H, GROUP, D, SPLIT)  # fmt: skip


@gluon.jit
def _decode_hopper_producer_kernel(
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr, heap_ptr, heap16_ptr, page_loc_ptr, meta_ptr,
    page_ids_ptr, work_ptr, num_splits_ptr, qk_scale, stride_qb, stride_qh, stride_ob, stride_oh,
    H: ttgl.constexpr, GROUP: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
    STAGES: ttgl.constexpr, SPLIT: ttgl.constexpr, GATHER_ALL: ttgl.constexpr, OP_K: ttgl.constexpr,
    OP_V: ttgl.constexpr, CW: ttgl.constexpr, HW: ttgl.constexpr, PG1: ttgl.constexpr,
    LEAN: ttgl.constexpr = False, PX: ttgl.constexpr = None, PAD_HI: ttgl.constexpr = False,
    PREPASS: ttgl.constexpr = False,
):  # fmt: skip
    """Program ``pid`` = (work item, KV head), heads fastest, as decode.py's without even shares. PREPASS:
    the producer also runs each coded tile's pre-pass (:func:`_finish_tile`), on more registers."""
    pid = ttgl.program_id(0)
    ring = _ring(STAGES, NP, D)
    bar_l: ttgl.constexpr = mbarrier.MBarrierLayout()
    ready = ttgl.allocate_shared_memory(ttgl.int64, [STAGES, 1], bar_l)
    empty = ttgl.allocate_shared_memory(ttgl.int64, [STAGES, 1], bar_l)
    for s in ttgl.static_range(STAGES):
        # without the pre-pass every producer thread arrives as its copies land; with it one, after it
        mbarrier.init(ready.index(s), count=1 if PREPASS else 32 * _PW)
        mbarrier.init(empty.index(s), count=1)
    scratch = lean_scratch(_M, NP * _PT, PX) if LEAN else None
    io = (q_ptr, out_ptr, o_part_ptr, lse_part_ptr, num_splits_ptr)
    tabs = (page_ids_ptr, page_loc_ptr, meta_ptr, work_ptr)
    strides = (stride_qb, stride_qh, stride_ob, stride_oh)
    glob = (heap_ptr, heap16_ptr)
    item = pid // H
    head = pid % H
    ttgl.warp_specialize(
        [
            (_consume, (ring, ready, empty, scratch, io, glob, tabs, item, head, qk_scale, strides, H, GROUP,
                        D, NP, STAGES, SPLIT, GATHER_ALL, OP_K, OP_V, CW, HW, PG1, LEAN, PAD_HI, PREPASS)),
            (_produce, (ring, ready, empty, heap_ptr, tabs, item, head, H, D, NP, STAGES, GATHER_ALL, LEAN,
                        CW, HW, PREPASS)),
        ],
        [_PW],
        [_PREGS_PREPASS if PREPASS else _PREGS],
    )  # fmt: skip

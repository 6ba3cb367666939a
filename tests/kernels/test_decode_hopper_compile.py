"""The Hopper decode kernel (kernels/attention/hopper/decode.py) without a GPU: its shared-memory views are
exact, and it compiles for sm_90 with the resources the H200 measurements were taken at.

The kernel is Gluon against Triton 3.6.0's API (the GPU machine's, SGLang 0.5.17's pin); scripts/setup.sh
puts that Triton in .cache/gluon-venv beside this environment's, and the compile runs there. Its numerics
are checked on the GPU (bench/kernels/bench_decode_hopper.py --check: bit-identical to the same kernel on raw
pages, and within 1e-2 of a float64 reference; docs/benchmarks.md).
"""

from __future__ import annotations

import json

import pytest
from gluon_venv import run_module

from zipkv.kernels.attention.decode_config import HOPPER_SPLIT_CAP
from zipkv.kernels.attention.hopper import layouts as views


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("pages", [1, 2, 4])
def test_views_map_every_element_to_its_offset(head_dim: int, pages: int) -> None:
    half, n = head_dim // 2, 16 * pages

    def lo_k(p: int, t: int) -> int:
        return views.lo_offset(t // 16, t % 16, p, head_dim)

    def lo_v(t: int, p: int) -> int:
        return views.lo_offset(t // 16, t % 16, p, head_dim)

    views.check_view([half, n], lo_k, views.operand_view(0, pages, head_dim))
    views.check_view([n, half], lo_v, views.operand_view(1, pages, head_dim))
    # Split by page (the per-warp softmax): element (page g, pair p, token t) is the 2D view's (p, 16 g + t).
    views.check_view(
        [pages, half, 16], lambda g, p, t: lo_k(p, 16 * g + t), views.page_operand_view(0, pages, head_dim)
    )
    views.check_view(
        [pages, 16, half], lambda g, t, p: lo_v(16 * g + t, p), views.page_operand_view(1, pages, head_dim)
    )
    # The lean tile's P buffer (hopper/lean.py): the MMA A fragment's order, a thread's fragment contiguous.
    views.check_view([16, n], lambda r, c: views.p_exchange_offset(r, c, n), views.p_exchange_view(n))
    assert [views.p_exchange_offset(1, c, n) - views.p_exchange_offset(1, 0, n) for c in (1, 8)] == [1, 4]
    assert views.p_exchange_offset(8, 0, n) - views.p_exchange_offset(0, 0, n) == 2
    shape = [pages, head_dim // 8, 16, 2]
    views.check_view(
        shape,
        lambda g, b, t, h: views.code_word_offset(g, b, t, h, head_dim),
        views.code_words_view(pages, head_dim),
    )
    views.check_view(
        shape,
        lambda g, b, t, w: views.hi_word_offset(g, b, t, w, head_dim),
        views.hi_words_view(pages, head_dim),
    )


def test_swizzle_spreads_ldmatrix_rows_over_banks() -> None:
    """8 consecutive rows' chunk c land in 8 different 16-byte bank groups (no ldmatrix conflicts)."""
    for head_dim in (64, 128, 256):
        for t0 in (0, 8):
            for c in range(min(8, head_dim // 16)):
                groups = {(2 * views.lo_offset(0, t, 8 * c, head_dim) // 16) % 8 for t in range(t0, t0 + 8)}
                assert len(groups) == 8, (head_dim, t0, c, sorted(groups))


def test_offset_bases_refuse_a_view_that_is_not_bijective() -> None:
    with pytest.raises(ValueError, match="bijective"):
        views.offset_bases([4, 4], lambda a, b: a)  # b never reaches an offset bit


def _compile_rows(*args: str) -> dict[int, dict[str, object]]:
    """bench/kernels/hopper_resources.py's rows by head_dim, compiled by .cache/gluon-venv's Triton 3.6.0."""
    rows = json.loads(run_module("bench.kernels.hopper_resources", "--json", *args))
    return {r["head_dim"]: r for r in rows}


def test_kernel_compiles_for_sm90() -> None:
    rows = _compile_rows("--head-dims", "64,128,256", "--pages", "4", "--stages", "2")
    for head_dim, r in rows.items():
        assert r["registers"] <= 255 and r["shared_bytes"] <= 227 * 1024, r
        assert r["ptx_cp_async"] > 0 and r["ptx_ldmatrix"] > 0 and r["ptx_mma"] > 0, r
        if head_dim <= 128:  # the measured shapes: three programs per SM (the plan's), no spill in the loop
            assert r["loop_local_accesses"] == 0 and r["registers"] * 128 * 3 <= 65536, r


def test_the_per_warp_softmax_compiles_for_sm90_with_four_programs_per_sm() -> None:
    """One page per warp (hopper/warp_softmax.py) at the default shape (2 pages, 2 warps): operands still
    come by ldmatrix, the loop does not spill at head_dim <= 128, and 224-ish registers keep four programs
    of 64 threads per SM, as the shared softmax does."""
    rows = _compile_rows(
        "--head-dims", "64,128,256", "--pages", "2", "--warps", "2", "--stages", "2", "--warp-softmax"
    )
    for head_dim, r in rows.items():
        assert r["warp_softmax"] is True
        assert r["ptx_cp_async"] > 0 and r["ptx_ldmatrix"] > 0 and r["ptx_mma"] > 0, r
        if head_dim <= 128:
            assert r["loop_local_accesses"] == 0 and r["registers"] * 64 * 4 <= 65536, r


def test_the_lazy_rescale_compiles_for_sm90_with_four_programs_per_sm() -> None:
    """The tile that skips its output rescale when no row max grew (restore._lazy_rescale), at the default
    shape (2 pages, 2 warps): the skip test is a shuffle reduction inside the warp (no more CTA barriers or
    shared accesses than the default), and the loop neither spills nor loses the fourth program per SM."""
    shape = ("--pages", "2", "--warps", "2", "--stages", "2")
    base = _compile_rows("--head-dims", "64,128,256", *shape)
    lazy = _compile_rows("--head-dims", "64,128,256", *shape, "--lazy-rescale")
    for head_dim, r in lazy.items():
        b = base[head_dim]
        assert r["lazy_rescale"] is True and b["lazy_rescale"] is False
        ops, b_ops = r["sass_ops"], b["sass_ops"]
        assert isinstance(ops, dict) and isinstance(b_ops, dict)
        assert ops.get("BAR", 0) == b_ops.get("BAR", 0) and ops.get("STS", 0) == b_ops.get("STS", 0), head_dim
        assert ops.get("SHFL", 0) > b_ops.get("SHFL", 0), head_dim  # the warp's vote
        if head_dim <= 128:
            assert r["loop_local_accesses"] == 0 and r["registers"] * 64 * 4 <= 65536, r


def test_the_lean_tile_compiles_for_sm90_with_fewer_instructions_a_tile() -> None:
    """The lean tile (hopper/lean.py, ring._copy_coded_lean, restore's LEAN pre-pass) at the default shape (2
    pages, 2 warps): a coded tile takes at least 8% fewer SASS instructions (5% at head_dim 64, where
    ptxas's schedule of the default tile moves most with unrelated code: the epilogue that writes unsplit
    requests' rows took it from 505 to 473, the lean tile from 440 to 448) and fewer CTA barriers than the
    default's, on no more registers (four programs of 64 threads per SM, no spill in the loop at head_dim <=
    128). The count is hopper_resources.coded_tile's: the main loop's path of a full tile, all pages coded."""
    least_cut = {64: 0.05, 128: 0.08, 256: 0.08}
    shape = ("--pages", "2", "--warps", "2", "--stages", "2")
    base = _compile_rows("--head-dims", "64,128,256", *shape)
    lean = _compile_rows("--head-dims", "64,128,256", *shape, "--lean")
    for head_dim, r in lean.items():
        b = base[head_dim]
        tile, b_tile = r["coded_tile"], b["coded_tile"]
        assert isinstance(tile, dict) and isinstance(b_tile, dict) and r["lean"] is True
        cut = 1 - least_cut[head_dim]
        assert tile["fewest"] <= cut * b_tile["fewest"], (head_dim, tile["fewest"], b_tile["fewest"])
        assert tile["ops"]["BAR"] < b_tile["ops"]["BAR"], head_dim  # the row max's second round trip
        # Six CTA barriers and no more: the ring's wait, the compiler's before the pre-pass reads the slot
        # (the next tile's copies went out just before, into a slot it cannot tell apart), the pre-pass's
        # two, the softmax's two exchanges. None where the three read paths join before the operand loads
        # (restore.tile_operands: each path ends on a barrier of its own).
        assert tile["ops"]["BAR"] <= 6, (head_dim, tile["ops"]["BAR"])
        # every instruction of the path has a phase; the lean copies take V's offset as an immediate
        assert sum(tile["phases"].values()) == tile["fewest"], tile["phases"]
        assert tile["phases"]["copies"] <= b_tile["phases"]["copies"], (head_dim, tile["phases"])
        assert r["registers"] <= b["registers"], (head_dim, r["registers"], b["registers"])
        if head_dim <= 128:
            assert r["loop_local_accesses"] == 0 and r["registers"] * 64 * 4 <= 65536, r


@pytest.mark.parametrize("warps", [1, 4])
def test_the_lean_tile_compiles_at_one_and_four_warps(warps: int) -> None:
    """The row-max exchange is per warp count (none at one warp; [16, NW] maxima at four)."""
    (r,) = _compile_rows("--pages", str(warps), "--warps", str(warps), "--stages", "2", "--lean").values()
    assert r["lean"] is True and r["ptx_mma"] > 0 and r["loop_local_accesses"] == 0, r


def test_even_shares_compile_with_the_tile_of_one_item_a_program() -> None:
    """Even shares (a program runs its items in turn, decode._decode_hopper_kernel's EVEN_SHARES) at the
    default shape and tile: the coded tile costs no more SASS instructions than one item a program's (a
    single loop over items made ptxas copy the Q fragments into the MMA's registers every tile, 643 against
    602), and four programs of 64 threads still fit an SM with no spill in the loop."""
    shape = ("--head-dims", "128", "--pages", "2", "--warps", "2", "--stages", "2", "--lean")
    base = _compile_rows(*shape)[128]
    even = _compile_rows(*shape, "--even-shares")[128]
    tile, b_tile = even["coded_tile"], base["coded_tile"]
    assert isinstance(tile, dict) and isinstance(b_tile, dict) and even["even_shares"] is True
    assert tile["fewest"] <= b_tile["fewest"], (tile["fewest"], b_tile["fewest"])
    assert even["loop_local_accesses"] == 0 and even["registers"] * 64 * 4 <= 65536, even


def test_the_padding_rows_fold_away_where_the_group_is_at_most_8() -> None:
    """lean.py's PAD_HI: with a GQA group of 4 the MMA's rows 8-15 are padding, held in registers of their
    own, so their rescale multiplies and exp2s fold away: a coded tile of the lean tile at the default
    shape issues about half the FMULs and MUFUs of a group of 16 (every row real) and fewer instructions
    in all, with no spill in the loop; also at the split cap's registers (decode_config.HOPPER_SPLIT_CAP),
    where the plan launches split requests."""
    shape = ("--head-dims", "64,128", "--pages", "2", "--warps", "2", "--stages", "2", "--lean")
    for cap in ((), ("--maxnreg", str(HOPPER_SPLIT_CAP[1]))):
        padded = _compile_rows(*shape, *cap, "--group", "4")
        full = _compile_rows(*shape, *cap, "--group", "16")
        for head_dim, r in padded.items():
            tile, f_tile = r["coded_tile"], full[head_dim]["coded_tile"]
            assert isinstance(tile, dict) and isinstance(f_tile, dict) and r["group"] == 4, r
            ops, f_ops = tile["ops"], f_tile["ops"]
            assert ops["FMUL"] <= 0.6 * f_ops["FMUL"], (head_dim, cap, ops, f_ops)
            assert ops["MUFU"] <= 0.6 * f_ops["MUFU"], (head_dim, cap, ops, f_ops)
            assert tile["fewest"] < f_tile["fewest"], (head_dim, cap, tile["fewest"], f_tile["fewest"])
            assert r["loop_local_accesses"] == 0, (head_dim, cap, r)


def test_the_producer_kernel_compiles_for_sm90_with_its_copies_off_the_consumer_warps() -> None:
    """hopper/specialized.py (four consumer warps, one page each, and a producer partition) at head_dims 64,
    128 and 256: the consumers' coded tile holds no global load or copy (the producer's loop holds them
    all), so at head_dim 128 a consumer warp issues at least 20% fewer SASS instructions a tile than a warp
    of the two-warp lean kernel does for the same 16 tokens (387 against 544 offline); no spill in either
    loop; ``setmaxnreg`` hands the consumers more registers than the 128 a thread of the launch; two
    programs fit an SM's shared memory at head_dim <= 128."""
    producer = _compile_rows(
        "--head-dims", "64,128,256", "--pages", "4", "--warps", "4", "--stages", "2", "--lean", "--producer"
    )
    base = _compile_rows("--head-dims", "128", "--pages", "2", "--warps", "2", "--stages", "2", "--lean")[128]
    for head_dim, r in producer.items():
        tile, loop = r["coded_tile"], r["producer_loop"]
        assert isinstance(tile, dict) and isinstance(loop, dict) and r["producer"] is True, r
        ops, loop_ops = tile["ops"], loop["ops"]
        assert not {"LDG", "LDGSTS"} & set(ops), (head_dim, ops)
        assert loop_ops.get("LDGSTS", 0) > 0 and loop_ops.get("LDG", 0) > 0, (head_dim, loop_ops)
        assert r["loop_local_accesses"] == 0 and r["registers"] <= 128, r
        regs = r["setmaxnreg"]
        assert isinstance(regs, dict) and max(regs["inc"]) > 128 > min(regs["dec"]), regs
        if head_dim <= 128:
            assert 2 * r["shared_bytes"] <= 227 * 1024, r
    tile, b_tile = producer[128]["coded_tile"], base["coded_tile"]
    assert isinstance(tile, dict) and isinstance(b_tile, dict)
    assert tile["fewest"] <= 0.8 * b_tile["fewest"], (tile["fewest"], b_tile["fewest"])
    # A producer warp's coded tile (its copies and table loads of one page, 243 offline) stays shorter
    # than a consumer warp's: the consumers remain the chain that sets the pace.
    loop = producer[128]["producer_loop"]
    assert isinstance(loop, dict) and 0 < loop["coded_path"]["instructions"] < tile["fewest"], loop


def test_the_producer_warps_can_take_the_pre_pass_too() -> None:
    """PREPASS (``ZIPKV_HOPPER_PRODUCER=2``): the producer warps also turn a coded tile's codes into high
    bytes, so a consumer warp's coded tile is operand loads, MMAs and the softmax: at most 40% of the
    two-warp lean kernel's instructions (199 against 544 offline) with fewer partition barriers than mode
    1's, no pre-pass and no spill in either loop, on the registers ``setmaxnreg`` leaves the consumers
    (152) and the producers (104)."""
    shape = ("--head-dims", "128", "--pages", "4", "--warps", "4", "--stages", "2", "--lean", "--producer")
    copies, prepass = _compile_rows(*shape)[128], _compile_rows(*shape, "--prepass")[128]
    base = _compile_rows("--head-dims", "128", "--pages", "2", "--warps", "2", "--stages", "2", "--lean")[128]
    tile, c_tile, b_tile = prepass["coded_tile"], copies["coded_tile"], base["coded_tile"]
    assert isinstance(tile, dict) and isinstance(c_tile, dict) and isinstance(b_tile, dict)
    assert prepass["prepass"] is True and copies["prepass"] is False
    assert tile["fewest"] <= 0.4 * b_tile["fewest"], (tile["fewest"], b_tile["fewest"])
    assert tile["ops"]["BAR"] < c_tile["ops"]["BAR"] and "pre-pass" not in tile["phases"], tile
    assert prepass["loop_local_accesses"] == 0 and prepass["stack_bytes"] == 0, prepass
    loop = prepass["producer_loop"]
    assert isinstance(loop, dict) and loop["ops"].get("STS", 0) > 0  # the pre-pass's stores: on the producer
    # and with it the producer warp's coded tile (443 offline) is the longer chain, the consumers' the shorter
    assert loop["coded_path"]["instructions"] > tile["fewest"], (loop["coded_path"], tile["fewest"])
    regs = prepass["setmaxnreg"]
    assert isinstance(regs, dict) and 104 in regs["inc"] and 152 in regs["dec"], regs

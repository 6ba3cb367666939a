"""How the decode plan cuts a batch into splits (kernels/attention/split_plan.py): balanced over the batch, so
a long request among short ones gets splits in proportion to its length, within the step's work items;
and the work list covers every request's tokens once, in order."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from paged_cases import make_case, rel_err, run_both

from zipkv.kernels.attention.decode_plan import _split_work, plan_decode, split_plan_impl
from zipkv.kernels.attention.even_shares_triton import even_shares_triton
from zipkv.kernels.attention.plan_shape import pair_slots
from zipkv.kernels.attention.split_plan import (
    balanced_splits,
    even_split_tiles,
    ladder_tiles,
    program_items,
    work_items,
)
from zipkv.kernels.attention.split_plan_triton import split_work_triton
from zipkv.kernels.format.layout import PageFormat

CASES = [  # (tiles per request, work items, most splits a request may have, expected splits)
    ([256] * 8, 16, 128, [2] * 8),  # equal requests: what the wave model gives each
    ([256] * 8, 8, 128, [1] * 8),
    ([300] * 100, 66, 128, [1] * 100),  # more requests than items: one split each
    ([4000], 66, 128, [63]),  # batch 1, 66 items: the ladder's 64 tiles -> 63 splits (59 would need 68)
    ([4000], 66, 66, [66]),  # capped at what the items allow: 66 splits of 61 tiles
    ([4000], 66, 8, [8]),  # the per-request cap
    ([1, 2, 3], 30, 128, [1, 1, 2]),  # a split reads at least MIN_SPLIT_TILES tiles
]


@pytest.mark.parametrize(("tiles", "slots", "cap", "want"), CASES)
def test_split_counts(tiles: list[int], slots: int, cap: int, want: list[int]) -> None:
    got = balanced_splits(torch.tensor(tiles), slots, cap)
    assert got.tolist() == want


def test_a_long_request_among_short_ones_gets_splits_in_proportion() -> None:
    """The Mooncake batch that was slow: one 87k-token request with 17 of 6.4k (tiles of 32 tokens), 54
    work items (18 requests x the wave model's 3 splits)."""
    tiles = torch.tensor([2720] + [200] * 17)
    splits, split_tiles = even_split_tiles(tiles, balanced_splits(tiles, 54, 37))
    assert int(splits.sum()) <= 54
    assert int(splits[0]) >= 20 and splits[1:].max() <= 2  # 3 each before: 907 tiles a split for the long one
    balance = -(-int(tiles.sum()) // 54)  # tiles per item if the work divided perfectly
    assert int(split_tiles.max()) <= 1.25 * balance  # 136 against 114; before: 907


PAIR_SLOTS = [  # (batch, KV heads, SMs, programs per SM, most splits, waves) -> (work items, most splits)
    ((1, 8, 132, 4, 128, 1), (66, 66)),  # batch 1: a wave of splits
    ((32, 8, 132, 4, 128, 1), (66, 35)),  # the wave model's 2 each would be 64: a wave's 66
    ((40, 8, 132, 4, 128, 1), (66, 27)),  # equal requests no longer split; 26 items spare for a long one
    ((47, 8, 132, 4, 128, 1), (66, 20)),
    ((66, 8, 132, 4, 128, 1), (66, 1)),  # a wave of whole requests: nothing to spare
    ((128, 8, 132, 4, 128, 1), (128, 1)),  # more: two waves, as before
    ((40, 8, 132, 4, 128, 4), (120, 81)),  # the portable kernel's four waves: the wave model already spares
    ((2, 8, 132, 4, 8, 1), (16, 8)),  # the per-request cap bounds the floor
    ((3, 8, 132, 4, 128, None), (3 * 5, 5)),  # asked for 5 splits each: exactly that (waves unused)
]


@pytest.mark.parametrize(("args", "want"), PAIR_SLOTS)
def test_the_step_has_a_wave_of_work_items_at_least(args: tuple, want: tuple[int, int]) -> None:
    batch, kv_heads, sms, ctas, cap, waves = args
    asked = 5 if waves is None else None
    got = pair_slots(asked, batch, kv_heads, sms, ctas, torch.device("cpu"), cap, waves or 1)
    assert got == want


def test_a_long_request_in_a_batch_of_forty_is_cut_in_proportion() -> None:
    """The sustained sweep's slow steps: 40 running, one of them 87k tokens, the rest about 6.4k. Before, 40
    items (one per request) left the long request in one program: 2,720 tiles where balance is 140."""
    items, most = pair_slots(None, 40, 8, 132, 4, torch.device("cpu"), 128, 1)
    tiles = torch.tensor([2720] + [200] * 39)
    splits, split_tiles = even_split_tiles(tiles, balanced_splits(tiles, items, most))
    assert int(splits.sum()) <= items
    balance = -(-int(tiles.sum()) // items)
    assert int(split_tiles.max()) <= 2 * balance, (int(split_tiles.max()), balance)


def test_the_work_list_covers_every_token_once_in_order() -> None:
    lens = torch.tensor([1, 16, 63, 700, 8192, 33], dtype=torch.int32)
    tiles = (lens.to(torch.int64) + 31) // 32
    splits, split_tiles = even_split_tiles(tiles, balanced_splits(tiles, 20, 15))
    pages = (lens + 15) // 16
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), pages.cumsum(0).to(torch.int32)])
    work, start = work_items(splits, split_tiles * 32, lens, indptr, 24)
    rows = work.tolist()
    for b, n in enumerate(lens.tolist()):
        mine = [r for r in rows if r[0] == b]
        assert mine == rows[int(start[b]) : int(start[b]) + int(splits[b])]  # consecutive, from pair_start
        assert mine[0][1] == 0 and mine[-1][2] == n
        assert all(a[2] == c[1] for a, c in itertools.pairwise(mine))  # no gap, no overlap
        assert all(r[1] < r[2] and r[3] == int(indptr[b]) for r in mine)  # no empty split; the first page
    assert all(r[0] == -1 for r in rows[int(splits.sum()) :])  # idle items past the last split


def test_the_plan_is_static_in_shape_whatever_the_lengths() -> None:
    """A CUDA graph replays the plan with new lengths: its grid and scratch depend on the batch size only."""
    fmt = PageFormat(128, 8)
    shapes = set()
    for lens in ([8192] * 4, [87000, 16, 2000, 5], [1, 1, 1, 1]):
        pages = [-(-n // 16) for n in lens]
        indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        plan = plan_decode(torch.arange(sum(pages), dtype=torch.int32), indptr,
                           torch.tensor(lens, dtype=torch.int32), fmt, 32, num_sms=132)  # fmt: skip
        shapes.add((plan.num_pairs, plan.max_splits, tuple(plan.o_partial.shape), tuple(plan.work.shape)))
    assert len(shapes) == 1


def test_a_skewed_batch_through_the_kernel(device) -> None:  # type: ignore[no-untyped-def]
    """One long request among short ones, split by the balanced plan: compressed == twin bit for bit, both
    match the float64 reference, and the long request is cut into more splits than the others."""
    case = make_case(128, 2, 4, [600, 20, 33, 17], device, raw_fraction=0.2)
    plan = case.plan(block_n=32, num_sms=4)
    assert int(plan.num_splits[0]) > int(plan.num_splits[1:].max())
    packed, twin = run_both(case, plan)
    assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
    assert rel_err(case, packed) < 1e-2


def test_the_ladder_is_exact_on_every_rung() -> None:
    """Fixed point, not float32 exp2 (which rounds rungs 146 and 154 up by one)."""
    want = [math.ceil(2 ** (c // 8 + 1) * 2 ** ((c % 8) / 8)) for c in range(160)]
    assert ladder_tiles(torch.device("cpu")).tolist() == want


def _batch(lens: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    kv = torch.tensor(lens, dtype=torch.int32)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), ((kv + 15) // 16).cumsum(0).to(torch.int32)])
    return kv.to(device), indptr.to(device)


KERNEL_CASES = [  # (context lengths, block_n, work items, most splits a request may have)
    ([8192], 32, 66, 66),  # batch 1: a wave of splits
    ([8192] * 32, 32, 66, 35),
    ([87000] + [6400] * 39, 32, 66, 27),  # the long request among short ones
    ([1, 16, 17, 33, 700], 16, 20, 16),  # a split of at least two tiles; idle items after the last split
    ([5] * 70, 64, 70, 1),  # one split each
    ([5] * 70 + [3000] * 70 + [1], 32, 150, 10),  # more requests than a chunk of the kernel's loops (128)
    ([2**31 - 64], 32, 132, 128),  # the longest context an int32 holds: past the ladder's top rung
]


@pytest.mark.parametrize(("lens", "block_n", "pairs", "most"), KERNEL_CASES)
def test_the_plan_kernel_gives_the_torch_plan_integer_for_integer(
    lens: list[int], block_n: int, pairs: int, most: int, device: str
) -> None:
    kv, indptr = _batch(lens, device)
    got = split_work_triton(kv, indptr, block_n, pairs, most)
    want = _split_work(kv.cpu(), indptr.cpu(), block_n, pairs, most)  # the CPU takes the torch ops
    for name, g, w in zip(("splits", "split_tokens", "work", "pair_start"), got, want, strict=True):
        assert g.dtype == torch.int32 and torch.equal(g.cpu(), w.to(torch.int32)), name


def test_the_plan_kernel_on_random_batches(device: str) -> None:
    rng = random.Random(7)
    for _ in range(12):
        batch = rng.choice([1, 2, 3, 8, 33, 40])
        lens = [rng.choice([1, 16, 17, 8192, 87000, rng.randint(1, 20000)]) for _ in range(batch)]
        pairs = max(batch, rng.choice([66, 132, 2 * batch]))
        most, block_n = min(rng.choice([1, 8, 66, 128]), pairs - batch + 1), rng.choice([16, 32, 64])
        kv, indptr = _batch(lens, device)
        got = split_work_triton(kv, indptr, block_n, pairs, most)
        want = _split_work(kv.cpu(), indptr.cpu(), block_n, pairs, most)
        assert all(torch.equal(g.cpu(), w.to(torch.int32)) for g, w in zip(got, want, strict=True)), lens


def test_an_unknown_split_plan_is_refused() -> None:
    assert split_plan_impl({}) == "kernel" and split_plan_impl({"ZIPKV_SPLIT_PLAN": " Torch "}) == "torch"
    with pytest.raises(ValueError, match="ZIPKV_SPLIT_PLAN"):
        split_plan_impl({"ZIPKV_SPLIT_PLAN": "fast"})


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [None, 66])  # the balanced splits, and even shares
def test_the_plan_records_into_a_cuda_graph_and_replays_new_lengths(programs: int | None) -> None:
    """SGLang records the decode plan into its CUDA graph (worker/engines/sglang/attention.py): planning must
    not sync with the host, and a replay with new lengths must give what planning them eagerly gives."""
    fmt, batch, width = PageFormat(128, 8), 6, 64  # the padded page table: 64 pages per request
    ids = torch.arange(batch * width, dtype=torch.int32, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * width
    lens = torch.tensor([1000, 16, 17, 500, 1, 1024], dtype=torch.int32, device="cuda")
    plan_decode(ids, indptr, lens, fmt, 32, programs=programs)  # warm-up outside the graph (lazy inits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            recorded = plan_decode(ids, indptr, lens, fmt, 32, programs=programs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    new = torch.tensor([3, 1024, 900, 16, 40, 2], dtype=torch.int32, device="cuda")
    lens.copy_(new)
    graph.replay()
    eager = plan_decode(ids, indptr, new, fmt, 32, programs=programs)
    for field in (
        "num_splits",
        "split_tokens",
        "work",
        "pair_start",
        *(("program_items",) if programs else ()),
    ):
        assert torch.equal(getattr(recorded, field), getattr(eager, field)), field


EVEN_CASES = [  # (request lengths in tokens, programs per KV head)
    ([8448] * 59, 66),  # SGLang's largest batch on the H200: 472 programs would leave 56 SMs a slot idle
    ([1000], 7),  # batch 1: the request cut in seven
    ([87000, 16, 2000, 5, 33], 10),  # skewed: the long request spans programs, short ones share one
    ([1, 1, 1], 8),  # fewer tiles than programs: some programs idle
    ([32, 64, 31], 1),  # one program runs every item in turn
]


@pytest.mark.parametrize(("lens", "programs"), EVEN_CASES)
def test_even_shares_give_every_program_the_same_tiles_and_cover_every_token_once(
    lens: list[int], programs: int
) -> None:
    block_n = 32
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    pages = (kv_lens + 15) // 16
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), pages.cumsum(0).to(torch.int32)])
    splits, split_tiles, work, start, prog = program_items(kv_lens, indptr, block_n, programs)
    rows, firsts = work.tolist(), prog.tolist()
    assert work.shape == (programs + len(lens), 4) and prog.shape == (programs + 1,)
    for b, n in enumerate(lens):  # each request's items: consecutive from pair_start, its tokens once
        mine = rows[int(start[b]) : int(start[b]) + int(splits[b])]
        assert [r[0] for r in mine] == [b] * int(splits[b]) and sum(r[0] == b for r in rows) == splits[b]
        assert mine[0][1] == 0 and mine[-1][2] == n
        assert all(a[2] == c[1] for a, c in itertools.pairwise(mine))
        assert all(r[1] < r[2] and r[1] % block_n == 0 and r[3] == int(indptr[b]) for r in mine)
    total = int(splits.sum())
    assert all(r[0] == -1 for r in rows[total:])
    # programs' items: one contiguous run each, all of them in order, every item in one program
    assert firsts[0] == 0 and firsts[-1] == total and firsts == sorted(firsts)
    tiles = [sum(-(-(r[2] - r[1]) // block_n) for r in rows[a:b]) for a, b in itertools.pairwise(firsts)]
    share = -(-sum(-(-n // block_n) for n in lens) // programs)
    assert max(tiles) == share and all(
        t == share for t in tiles[: sum(-(-n // block_n) for n in lens) // share]
    )
    assert int(split_tiles.max()) <= share


def test_a_batch_in_even_shares_through_the_kernel(device) -> None:  # type: ignore[no-untyped-def]
    """Programs that run several items in turn (three programs for four requests, one for all): the
    compressed run equals the raw-page run bit for bit and both match the float64 reference. On an sm_90
    GPU with v3 pages this is the Hopper kernel's program loop; elsewhere the portable kernel runs the
    same items one per program."""
    case = make_case(
        128, 2, 4, [600, 20, 33, 170], device, raw_fraction=0.2, version=3 if device == "cuda" else 2
    )
    for programs in (3, 1):
        plan = case.plan(block_n=32, programs=programs)
        assert plan.program_items is not None and plan.num_programs == programs
        packed, twin = run_both(case, plan)
        assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
        assert rel_err(case, packed) < 1e-2


def test_the_even_shares_kernel_gives_the_torch_plan_integer_for_integer(device: str) -> None:
    """even_shares_triton.py against split_plan.program_items: the listed cases and random batches."""
    rng = random.Random(7)
    cases = [*EVEN_CASES, ([5] * 200, 66)]  # more requests than programs: several items a program
    cases += [([rng.choice([1, 16, 17, 100, 4000, 30000]) for _ in range(rng.randint(1, 150))],
               rng.choice([1, 3, 66, 99, 132])) for _ in range(6)]  # fmt: skip
    for lens, programs in cases:
        kv_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        pages = (kv_lens + 15) // 16
        indptr = torch.cat(
            [torch.zeros(1, dtype=torch.int32, device=device), pages.cumsum(0).to(torch.int32)]
        )
        want = program_items(kv_lens, indptr, 32, programs)
        got = even_shares_triton(kv_lens, indptr, 32, programs)
        for name, w, g in zip(("splits", "split_tokens", "work", "pair_start", "program_items"), want, got,
                              strict=True):  # fmt: skip
            w = w * 32 if name == "split_tokens" else w
            assert torch.equal(w.to(torch.int64), g.to(torch.int64)), (name, len(lens), programs)

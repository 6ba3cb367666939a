"""The pool's pack both ways (allocator/pack.py): the torch gather-and-scatter and the Triton kernel
(kernels/codec/pack.py, under the interpreter on a CPU) put the same bytes in the same places, where packed
places overlap earlier stage places and slices split a region."""

from __future__ import annotations

import pytest
import torch

from zipkv.allocator import PagePool
from zipkv.allocator.pack import POOL_PACK_ENV, Packer, pack_choice
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import pages as reference

RAW_UNITS, WORDS = 16, 8


def region(sizes: list[int], base: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(stage, dst, size_units) of one region's pages: staged a raw page apart, packed one after another."""
    size = torch.tensor(sizes, dtype=torch.int64)
    stage = base + torch.arange(len(sizes), dtype=torch.int64) * RAW_UNITS
    dst = base + torch.cumsum(size, 0) - size
    return stage, dst, size


@pytest.mark.parametrize("slice_pages", [1, 3, 64], ids=["page-slices", "split-region", "one-slice"])
def test_both_ways_pack_the_same_units(slice_pages: int) -> None:
    gen = torch.Generator().manual_seed(slice_pages)
    sizes = torch.randint(RAW_UNITS // 2, RAW_UNITS + 1, (9,), generator=gen).tolist()
    stage, dst, size = region(sizes, base=5)
    assert bool((dst[1:] < stage[:-1] + RAW_UNITS).any()), "packed places must overlap earlier stage places"
    scratch = 5 + 9 * RAW_UNITS + 3
    start = torch.randint(-(2**62), 2**62, (scratch + 1, WORDS), generator=gen)
    out = {}
    for impl in ("torch", "triton"):
        units = start.clone()
        Packer(units, RAW_UNITS, slice_pages, scratch).pack(stage, dst, size, impl)
        out[impl] = units[:scratch]  # the scratch unit takes the torch way's dropped units
    assert torch.equal(out["torch"], out["triton"])
    for i, n in enumerate(sizes):  # and what they agree on is the staged bytes, packed
        s = int(stage[i])
        assert torch.equal(out["triton"][int(dst[i]) : int(dst[i]) + n], start[s : s + n])


def test_a_pool_encodes_to_the_same_heap_either_way() -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=1, version=3)
    pools = {}
    for impl in ("torch", "triton"):
        pool = PagePool(fmt, 2, 64 * fmt.raw_page_bytes, chunk_bytes=4 * fmt.raw_page_bytes)
        pool.pack_impl = impl
        pool._slice_pages = 3  # slices split the step's regions
        ids = pool.allocate(10)
        gen = torch.Generator().manual_seed(0)
        slots = (torch.tensor(ids)[:, None] * 16 + torch.arange(16)).reshape(-1)
        for layer in range(2):
            k, v = (torch.randn(slots.numel(), 1, 64, generator=gen).bfloat16() for _ in range(2))
            reference.store_tokens(pool.heap, pool.page_loc[layer], slots, k, v, fmt)
        pool.mark_full(ids)
        pool.end_step()
        pool.settle()
        assert pool.stats().compressed_pages == 10
        pools[impl] = pool
    a, b = pools["torch"], pools["triton"]
    assert torch.equal(a.page_loc, b.page_loc) and torch.equal(a.page_meta, b.page_meta)
    used = int(a.page_loc.max()) + fmt.raw_page_bytes
    assert torch.equal(a.heap[:used], b.heap[:used])


def test_the_pack_is_chosen_at_start_up_and_a_typo_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POOL_PACK_ENV, raising=False)
    # unset: the kernel where the GPU measured it faster, the torch way on the CPU (the kernel there is
    # interpreted) and on any device nobody measured
    assert [pack_choice(d) for d in ("cuda", "cpu", "mps")] == ["triton", "torch", "torch"]
    monkeypatch.setenv(POOL_PACK_ENV, "Torch")
    assert pack_choice("cuda") == "torch"
    monkeypatch.setenv(POOL_PACK_ENV, "Triton")
    assert pack_choice("cpu") == "triton"
    monkeypatch.setenv(POOL_PACK_ENV, "cuda")
    with pytest.raises(ValueError, match="ZIPKV_POOL_PACK"):
        pack_choice("cuda")
    with pytest.raises(ValueError, match="expected 'torch' or 'triton'"):
        Packer(torch.zeros(4, 1, dtype=torch.int64), 1, 1, 3).pack(*region([1], 0), "cuda")


def test_every_pool_takes_the_choice_when_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pool reads the choice itself, so the SGLang worker, the reference engine and the benches agree
    fmt = PageFormat(head_dim=64, num_kv_heads=1, version=3)

    def make() -> PagePool:
        return PagePool(fmt, 2, 64 * fmt.raw_page_bytes, chunk_bytes=4 * fmt.raw_page_bytes)

    monkeypatch.delenv(POOL_PACK_ENV, raising=False)
    assert make().pack_impl == "torch"  # on the CPU
    monkeypatch.setenv(POOL_PACK_ENV, "triton")
    assert make().pack_impl == "triton"
    monkeypatch.setenv(POOL_PACK_ENV, "tritn")
    with pytest.raises(ValueError, match="ZIPKV_POOL_PACK='tritn'"):
        make()

"""zipkv's SGLang allocator on the CPU: slot/page arithmetic, fill/free ordering, live available_size().

Runs over a real PagePool (CPU, torch reference encoder); no sglang needed. Tests that compress pages run at
page formats v2 and v3 (the ``fmt`` fixture of tests/worker/conftest.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from zipkv.allocator import PagePool
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import pages as reference
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.idle_check import idle_check
from zipkv.worker.engines.sglang.slots import (
    budget_bytes_for_tokens,
    decode_slots,
    extend_slots,
    plan_extend,
    raw_bytes_per_token,
    virtual_pages_for_budget,
)

FMT = PageFormat(head_dim=64, num_kv_heads=1, version=2)  # raw page 4096 B
FMT_V3 = PageFormat(head_dim=64, num_kv_heads=1, version=3)  # raw page 4096 B, 64-byte units
LAYERS = 2


def make(
    raw_tokens: int = 64 * PAGE_TOKENS, compression: bool = True, fmt: PageFormat = FMT
) -> ZipkvAllocator:
    budget = budget_bytes_for_tokens(raw_tokens, fmt, LAYERS) + 4 * fmt.raw_page_bytes
    pool = PagePool(
        fmt,
        LAYERS,
        budget,
        chunk_bytes=4 * fmt.raw_page_bytes,
        compression=compression,
        max_pages=virtual_pages_for_budget(budget, fmt, LAYERS, compression),
    )
    return ZipkvAllocator(pool, "cpu", compression)


def reference_extend_slots(prefix, seq, last_loc, new_pages):  # type: ignore[no-untyped-def]
    out, k = [], 0
    for p, s, last in zip(prefix, seq, last_loc, strict=True):
        page, used = (last // PAGE_TOKENS, p % PAGE_TOKENS) if p % PAGE_TOKENS else (None, PAGE_TOKENS)
        for _ in range(p, s):
            if used == PAGE_TOKENS:
                page, used = new_pages[k], 0
                k += 1
            out.append(page * PAGE_TOKENS + used)
            used += 1
    return out


@pytest.mark.parametrize("version", [2, 3])
def test_budget_and_virtual_pages_for_the_llama_shape(version: int) -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=8, version=version)
    assert raw_bytes_per_token(fmt, 32) == 131072  # SGLang's cell size for Llama-3.1-8B bf16
    budget = budget_bytes_for_tokens(46 * 8448, fmt, 32)
    assert budget == 46 * 8448 * 131072
    assert virtual_pages_for_budget(budget, fmt, 32, compression=False) == 46 * 8448 // 16 + 1
    # every page at 768/1024 (v3: 192/256) of raw: 4/3 as many page ids as raw pages fit
    assert virtual_pages_for_budget(budget, fmt, 32, compression=True) == 46 * 8448 // 16 * 4 // 3 + 1


def test_plan_extend_counts_new_full_and_tail_pages() -> None:
    plan = plan_extend([0, 20, 32, 5], [40, 40, 32, 9])
    assert plan.new_pages_per_req == [3, 1, 0, 0]
    assert plan.full_new_pages_per_req == [2, 0, 0, 0]
    assert plan.tail_fill_reqs == [1]  # 20 -> 40 completes the page holding tokens 16..31
    with pytest.raises(ValueError, match="0 <= p <= s"):
        plan_extend([5], [4])


def test_extend_slots_match_a_token_by_token_walk() -> None:
    rng = random.Random(0)
    for _ in range(50):
        bs = rng.randint(1, 5)
        prefix = [rng.choice([0, rng.randint(0, 40)]) for _ in range(bs)]
        seq = [p + rng.randint(0, 50) for p in prefix]
        last = [rng.randint(1, 99) * PAGE_TOKENS + (p - 1) % PAGE_TOKENS if p else -1 for p in prefix]
        n_new = plan_extend(prefix, seq).num_new_pages
        new_pages = rng.sample(range(100, 1000), n_new)
        last_loc = torch.tensor(last, dtype=torch.int32)  # as SGLang passes it (read from req_to_token)
        got = extend_slots(prefix, seq, last_loc, torch.tensor(new_pages, dtype=torch.int64))
        assert got.dtype == torch.int64
        assert got.tolist() == reference_extend_slots(prefix, seq, last, new_pages)


def test_decode_slots_start_a_page_only_at_a_boundary() -> None:
    last_loc = torch.tensor([160, 161, -1, 334], dtype=torch.int32)  # int32, as read from req_to_token
    got = decode_slots([17, 18, 1, 32], last_loc, torch.tensor([7, 9]))
    assert got.dtype == torch.int64 and got.tolist() == [7 * 16, 162, 9 * 16, 335]


def fill(alloc: ZipkvAllocator, slots: torch.Tensor, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    fmt = alloc.pool.fmt
    for layer in range(LAYERS):
        k, v = (
            torch.randn(slots.numel(), fmt.num_kv_heads, fmt.head_dim, generator=gen).to(torch.bfloat16)
            for _ in range(2)
        )
        reference.store_tokens(alloc.pool.heap, alloc.pool.page_loc[layer], slots, k, v, fmt)


def test_extend_allocates_pool_pages_and_available_size_follows(fmt: PageFormat) -> None:
    alloc = make(fmt=fmt)
    before = alloc.available_size()
    out = alloc.alloc_extend(
        torch.tensor([0, 0]),
        torch.tensor([0, 0]),
        torch.tensor([40, 16]),
        torch.tensor([40, 16]),
        torch.tensor([-1, -1]),
        56,
    )
    assert out is not None and out.numel() == 56 and len(set(out.tolist())) == 56
    pages = sorted(set((out // PAGE_TOKENS).tolist()))
    assert len(pages) == 4 and 0 not in pages  # page 0 stays the padding page
    assert alloc.available_size() == before - 4 * PAGE_TOKENS
    alloc.free(out)
    assert alloc.available_size() == before
    assert idle_check(alloc, 0, 0, 0, 0)[0] is False


def test_pages_compress_one_step_after_they_fill_and_capacity_grows(fmt: PageFormat) -> None:
    # 96 of 128 pages: compression frees more than the encode margin (a chunk per layer, held first)
    alloc = make(128 * PAGE_TOKENS, fmt=fmt)
    before = alloc.available_size()
    n = 96 * PAGE_TOKENS
    out = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n
    )
    assert out is not None
    alloc.compress_step()  # forward step 1 starts: its pages are being written, not compressed yet
    assert alloc.pool.stats().compressed_pages + alloc.pool.stats().encoding_pages == 0
    fill(alloc, out)
    assert alloc.compress_step() == 96  # step 2: the pages step 1 filled go to the encoder
    for _ in range(4):  # the pool may spread a large batch over a few launches (worst-case log room)
        if alloc.pool.stats().compressed_pages == 96:
            break
        alloc.compress_step()
    stats = alloc.pool.stats()
    assert stats.compressed_pages == 96 and stats.compression_ratio < 0.8
    # the raw copies went back and the compressed ones take fewer bytes: more new pages fit than before
    assert alloc.available_size() > before - n
    alloc.free(out)
    assert idle_check(alloc, 0, 0, 0, 0)[0] is False


def test_decode_fill_is_found_on_the_device_and_marked_next_step(fmt: PageFormat) -> None:
    alloc = make(fmt=fmt)
    out = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([15]), torch.tensor([15]), torch.tensor([-1]), 15
    )
    assert out is not None
    alloc.compress_step()
    fill(alloc, out)
    last_loc = out[-1:].to(torch.int32)  # SGLang reads it from req_to_token (int32)
    slot = alloc.alloc_decode(torch.tensor([16]), torch.tensor([16]), last_loc)  # 16th token fills the page
    assert slot is not None and slot.tolist() == [out[-1].item() + 1]
    alloc.compress_step()  # the decode step writing token 16
    fill(alloc, slot, seed=1)
    assert alloc.compress_step() == 1
    new = alloc.alloc_decode(torch.tensor([17]), torch.tensor([17]), slot)
    assert new is not None and new.item() // PAGE_TOKENS not in (0, slot.item() // PAGE_TOKENS)


def test_a_page_freed_before_its_step_ends_is_never_marked() -> None:
    alloc = make()
    out = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([32]), torch.tensor([32]), torch.tensor([-1]), 32
    )
    assert out is not None
    alloc.compress_step()
    alloc.free(out)  # e.g. aborted: freed (and reusable) before the fill would be marked
    again = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([8]), torch.tensor([8]), torch.tensor([-1]), 8
    )
    assert again is not None
    assert alloc.compress_step() == 0  # the reused page is half written: it must not be compressed
    assert alloc.pool.stats().encoding_pages == 0


def test_out_of_pages_returns_none_and_keeps_state() -> None:
    alloc = make(raw_tokens=8 * PAGE_TOKENS, compression=False)
    fit = alloc.available_size() // PAGE_TOKENS
    n = (fit + 1) * PAGE_TOKENS
    assert (
        alloc.alloc_extend(
            torch.tensor([0]), torch.tensor([0]), torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n
        )
        is None
    )
    assert alloc.available_size() == fit * PAGE_TOKENS


def test_idle_check_reports_a_leaked_page() -> None:
    alloc = make()
    out = alloc.alloc(2 * PAGE_TOKENS)
    assert out is not None
    leak, msg = idle_check(alloc, 0, 0, 0, 0)  # nobody owns the two pages
    assert leak and "held_tokens=32" in msg
    assert idle_check(alloc, 32, 0, 0, 0)[0] is False  # the prefix cache owns them
    with pytest.raises(ValueError, match="whole number"):
        alloc.alloc(5)


def test_free_segment_frees_each_page_once() -> None:
    alloc = make()
    before = alloc.available_size()
    out = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([48]), torch.tensor([48]), torch.tensor([-1]), 48
    )
    assert out is not None
    alloc.free_group_begin()
    alloc.free_segment(out[20:], start_pos=20)  # pages 1 and 2, one representative slot each
    alloc.free_group_end()
    assert alloc.available_size() == before - PAGE_TOKENS  # page 0 still held
    alloc.free_segment(out[:16], start_pos=0)
    assert alloc.available_size() == before
    assert idle_check(alloc, 0, 0, 0, 0)[0] is False


def test_chunked_prefill_completes_the_partial_page_of_the_previous_chunk(fmt: PageFormat) -> None:
    alloc = make(fmt=fmt)
    z = torch.tensor([0])
    first = alloc.alloc_extend(z, z, torch.tensor([20]), torch.tensor([20]), z - 1, 20)  # page A full, B 4/16
    assert first is not None
    assert alloc.compress_step() == 0  # chunk 1 is being written
    fill(alloc, first)
    last_loc = first[-1:].to(torch.int32)
    second = alloc.alloc_extend(
        torch.tensor([20]), torch.tensor([20]), torch.tensor([40]), torch.tensor([40]), last_loc, 20
    )
    assert second is not None
    assert second[:12].tolist() == list(range(int(first[-1]) + 1, int(first[-1]) + 13))  # B's 12 free slots
    assert alloc.compress_step() == 1  # page A, filled by chunk 1
    fill(alloc, second, seed=2)
    assert alloc.compress_step() == 1  # page B, completed by chunk 2 (found on the device from last_loc)
    assert alloc.compress_step() == 0  # page C holds 8 tokens: not full


def test_ranks_agree_on_headroom_whatever_their_pages_compress_to(fmt: PageFormat) -> None:
    # Tensor parallelism: each rank compresses its own heads to its own sizes; both must admit alike.
    ranks = [make(128 * PAGE_TOKENS, fmt=fmt) for _ in range(2)]
    for alloc in ranks:
        alloc.agree_across_ranks()
    before = [a.available_size() for a in ranks]
    assert before[0] == before[1]
    n = 96 * PAGE_TOKENS
    for k, alloc in enumerate(ranks):
        out = alloc.alloc_extend(
            torch.tensor([0]), torch.tensor([0]), torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n
        )
        assert out is not None
        alloc.compress_step()
        if k == 0:  # rank 0's pages hold random KV; rank 1's are zeros, which compress further
            fill(alloc, out)
        for _ in range(5):
            alloc.compress_step()
    pools = [a.pool.stats() for a in ranks]
    assert pools[0].compressed_pages == pools[1].compressed_pages == 96
    assert pools[0].headroom_pages != pools[1].headroom_pages  # alone, the ranks would admit differently
    # the bytes compression saved are not lent: both see the raw view, the same number
    assert ranks[0].available_size() == ranks[1].available_size() == before[0] - n
    with pytest.raises(RuntimeError, match="empty pool"):
        ranks[0].agree_across_ranks()


def test_the_hopper_kernel_runs_its_own_measured_shape_inside_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    from zipkv.kernels.attention import decode_config as dc
    from zipkv.kernels.format.layout import PageFormat
    from zipkv.worker.engines.sglang.attention import step_kernel_config

    v3 = PageFormat(head_dim=128, num_kv_heads=8, version=3)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert step_kernel_config(v3, cpu) == dc.kernel_config(128)  # the portable kernel: its tuned shape
    monkeypatch.setattr(dc, "is_sm90", lambda device: device.type == "cuda")  # as on an H200
    monkeypatch.delenv(dc.KERNEL_CONFIG_ENV, raising=False)
    assert step_kernel_config(v3, gpu) is None  # plan_decode then takes HOPPER_CONFIG
    monkeypatch.setenv(dc.KERNEL_CONFIG_ENV, "64:4:3:2:3:0")  # an explicit shape still wins
    assert step_kernel_config(v3, gpu) == dc.parse_kernel_config("64:4:3:2:3:0")

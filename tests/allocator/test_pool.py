"""PagePool with real pages on the CPU: the torch reference encoder compresses them, the page table follows
every move, the tensors the kernels read keep their addresses, and admitted requests always finish; at page
formats v2 (256-byte units) and v3 (64-byte units) through the ``fmt`` fixture."""

from __future__ import annotations

import pytest
import torch
from pool_harness import CHUNK_BYTES, FMT, KINDS, Harness, coded_blocks, make_pool, token_values

from zipkv.allocator import OutOfPages, PagePool
from zipkv.allocator.audit import check
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import pages as reference


def test_full_pages_are_compressed_in_every_layer_and_read_back(fmt: PageFormat) -> None:
    h = Harness(make_pool(layers=3, chunks=24, fmt=fmt))
    for kind in KINDS:
        h.admit(64, kind)
    h.step(32)  # two full pages per request
    h.check_data()
    stats = h.pool.stats()
    assert stats.compressed_pages == 6 and stats.encoding_pages == 0
    smooth, wide = h.running["r0"].pages[0], h.running["r2"].pages[0]
    sizes = h.pool.ledger.page_units[:, [smooth, wide]] * h.pool.unit_bytes
    assert (sizes[:, 0] < fmt.raw_page_bytes).all()  # smooth values compress ...
    assert (sizes[:, 1] == fmt.raw_page_bytes).all()  # ... values spread over 2^60 do not
    assert coded_blocks(h.pool.page_meta[:, smooth], fmt).any()
    assert fmt.min_page_bytes / fmt.raw_page_bytes <= stats.compression_ratio < 1.0
    check(h.pool.ledger)


def test_stored_bytes_and_metadata_are_the_reference_encoders(fmt: PageFormat) -> None:
    pool = make_pool(layers=2, chunks=12, fmt=fmt)
    (page,) = pool.allocate(1)
    pages = {}
    for layer, kind in enumerate(("zeros", "smooth")):
        kv = token_values(kind, layer, 16, fmt)  # [16, 2, H, D]
        slots = torch.arange(16) + page * 16
        reference.store_tokens(pool.heap, pool.page_loc[layer], slots, kv[:, 0], kv[:, 1], fmt)
        pages[layer] = kv.permute(1, 2, 0, 3).contiguous()  # [2, H, 16, D]
    pool.mark_full([page])
    pool.end_step()
    for layer, values in pages.items():
        data, meta = reference.encode_page(values, fmt)
        start = int(pool.page_loc[layer, page])
        assert start % pool.unit_bytes == 0 and start % fmt.page_alignment_bytes == 0
        assert pool.ledger.page_units[layer, page] * pool.unit_bytes == data.numel()
        assert torch.equal(pool.heap[start : start + data.numel()], data)
        assert torch.equal(pool.page_meta[layer, page], meta)


def test_kernel_tensors_keep_their_addresses(fmt: PageFormat) -> None:
    h = Harness(make_pool(layers=2, chunks=20, fmt=fmt, compaction_interval_steps=1))
    addresses = (h.pool.heap.data_ptr(), h.pool.page_loc.data_ptr(), h.pool.page_meta.data_ptr())
    for i in range(5):
        h.admit(40 + 16 * i, KINDS[i % 3])
    for _ in range(10):
        h.step(9)
        h.pool.compact()
    assert (h.pool.heap.data_ptr(), h.pool.page_loc.data_ptr(), h.pool.page_meta.data_ptr()) == addresses
    # Each layer's view is rows of those same tensors, so what an engine reads through it stays current.
    for layer in range(2):
        pages = h.pool.layer(layer)
        assert pages.heap is h.pool.heap
        assert pages.loc.data_ptr() == h.pool.page_loc[layer].data_ptr()
        assert torch.equal(pages.meta, h.pool.page_meta[layer])


def test_compaction_keeps_every_page_readable(fmt: PageFormat) -> None:
    h = Harness(make_pool(layers=2, chunks=40, fmt=fmt, compaction_interval_steps=10**6))
    for i in range(8):
        h.admit(96 if i % 2 else 48, "smooth")
    for _ in range(4):
        h.step(12)  # the short requests finish and leave holes between the long ones' pages
    before = {r: list(q.pages) for r, q in h.running.items()}
    assert h.pool.stats().dead_bytes > 0
    moved = h.pool.compact()
    h.pool.poll()
    assert moved > 0
    h.check_data()
    check(h.pool.ledger)
    assert {r: q.pages for r, q in h.running.items()} == before  # page ids are stable


@pytest.mark.parametrize("shared_pool", [False, True])
def test_requests_admitted_by_capacity_all_finish(shared_pool: bool, fmt: PageFormat) -> None:
    h = Harness(make_pool(layers=2, chunks=32, shared_pool=shared_pool, fmt=fmt))
    admitted = 0
    for step in range(40):
        for kind in KINDS:
            if h.admit(48 + (step * 7) % 80, kind) is not None:
                admitted += 1
        h.step(5)  # raises OutOfPages if an admitted request ever lacks a page
    while h.running:
        h.step(16)
    assert admitted > 20
    assert h.pool.stats().used_pages == 0
    check(h.pool.ledger)


def test_out_of_pages_is_clear_and_changes_nothing() -> None:
    pool = make_pool(layers=2, chunks=8)
    fit = pool.headroom_pages()
    with pytest.raises(OutOfPages, match="do not fit"):
        pool.allocate(fit + 1)
    assert pool.headroom_pages() == fit and pool.stats().used_pages == 0


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of the raw page size"):
        PagePool(FMT, 2, 1 << 20, chunk_bytes=CHUNK_BYTES + 256)
    with pytest.raises(ValueError, match="raise the budget"):
        PagePool(FMT, 4, 3 * CHUNK_BYTES, chunk_bytes=CHUNK_BYTES)


@pytest.mark.gpu
def test_on_cuda_with_the_triton_codec(fmt: PageFormat) -> None:
    """The same serving loop on the GPU: Triton encode, CUDA-event fences, sizes read a step later."""
    h = Harness(make_pool(layers=3, chunks=40, fmt=fmt, device="cuda"))
    for i in range(6):
        h.admit(48 + 16 * i, KINDS[i % 3])
    for _ in range(12):
        h.step(9)
        torch.cuda.synchronize()  # the test reads the heap; the pool itself never waits
        h.check_data()
        check(h.pool.ledger)
    assert h.pool.stats().compressed_pages > 0


@pytest.mark.parametrize(("version", "unit"), [(1, 256), (2, 256), (3, 64)])
def test_heap_size_is_rounded_down_to_whole_units(version: int, unit: int) -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=1, version=version)
    pool = PagePool(fmt, 2, 8 * CHUNK_BYTES + 1000, chunk_bytes=CHUNK_BYTES)
    assert pool.unit_bytes == unit == fmt.raw_block_bytes - fmt.compressed_block_bytes
    assert pool.heap.numel() == 8 * CHUNK_BYTES + 1000 // unit * unit and pool.ledger.cfg.num_chunks == 8


def test_stats_count_compressed_blocks_as_the_encoders_markers_do(fmt: PageFormat) -> None:
    # The block counts come from stored sizes on the host; the encoder's per-block markers are the truth.
    pool = make_pool(layers=2, chunks=12, fmt=fmt)
    pages = pool.allocate(4)
    kinds = ("smooth", "wide", "zeros", "smooth")
    for layer in range(2):
        for page, kind in zip(pages, kinds, strict=True):
            kv = token_values(kind, layer, 16, fmt)  # [16, 2, H, D]
            slots = torch.arange(16) + page * 16
            reference.store_tokens(pool.heap, pool.page_loc[layer], slots, kv[:, 0], kv[:, 1], fmt)
    pool.mark_full(pages[:3])  # the fourth page stays raw: not counted
    pool.end_step()
    coded = coded_blocks(pool.page_meta[:, pages[:3]], fmt)
    expected = int(coded.sum())
    stats = pool.stats()
    assert stats.compressed_pages == 3 and stats.raw_pages == 1
    assert 0 < expected < coded.numel()  # smooth compresses, wide does not: a mixed count
    assert stats.compressed_blocks == expected
    assert stats.compressed_page_blocks == coded.numel() == 2 * 3 * fmt.blocks_per_page

"""The public reference codec (kernels/reference/page_codec.py): round trips and sizes, every version and
head_dim."""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels.format.layout import SUPPORTED_HEAD_DIMS, SUPPORTED_VERSIONS, PageFormat
from zipkv.kernels.reference import page_codec

CASES = [(v, d, kv) for v in SUPPORTED_VERSIONS for d in SUPPORTED_HEAD_DIMS for kv in (0, 1)]
SPECIALS = [
    0x7FC1,
    0xFF80,
    0x7F80,
    0x8000,
    0x0000,
    0x0001,
    0x807F,
    0x7F7F,
    0xFFFF,
]  # NaNs, infs, -0, subnormals


def _bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16)


def _page_head(head_dim: int, seed: int) -> torch.Tensor:
    """Normal values (most blocks code) with special bit patterns in the first rows (their blocks raw)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(16, head_dim, generator=gen).bfloat16()
    bits = values.view(torch.int16).to(torch.int32) & 0xFFFF
    bits[0, : len(SPECIALS)] = torch.tensor(SPECIALS)
    bits[5, head_dim - 1] = 0x3F80 | (1 << 15)  # -1.0: fits any window
    return _bits_to_bf16(bits)


@pytest.mark.parametrize(("version", "head_dim", "kv"), CASES)
def test_page_head_round_trips_with_format_sizes(version: int, head_dim: int, kv: int) -> None:
    fmt = PageFormat(head_dim, 1, version=version)
    for values in (_page_head(head_dim, version * 7 + kv), (1 + torch.rand(16, head_dim)).bfloat16()):
        enc = page_codec.encode_page_head(values, kv, version)
        assert torch.equal(page_codec.decode_page_head(enc).view(torch.int16), values.view(torch.int16))
        raw = enc.blocks - enc.coded_blocks
        assert enc.blocks == fmt.blocks_per_page_head
        assert enc.stored_bytes == enc.coded_blocks * fmt.compressed_block_bytes + raw * fmt.raw_block_bytes
        assert enc.meta_bytes == fmt.meta_bytes
        assert enc.raw_bytes == fmt.raw_page_head_bytes
    # the one-exponent values code in every block; the special patterns send some blocks raw
    assert enc.coded_blocks == enc.blocks
    assert 0 < page_codec.encode_page_head(_page_head(head_dim, 1), kv, version).coded_blocks < enc.blocks


@pytest.mark.parametrize(("version", "head_dim", "kv"), CASES)
def test_a_page_head_of_random_bits_is_stored_at_raw_size(version: int, head_dim: int, kv: int) -> None:
    bits = torch.randint(0, 1 << 16, (16, head_dim), generator=torch.Generator().manual_seed(head_dim))
    values = _bits_to_bf16(bits.to(torch.int32))
    enc = page_codec.encode_page_head(values, kv, version)
    assert enc.coded_blocks == 0 and enc.stored_bytes == enc.raw_bytes
    assert torch.equal(page_codec.decode_page_head(enc).view(torch.int16), values.view(torch.int16))


def _pages(fmt: PageFormat, seed: int) -> torch.Tensor:
    """Three pages: coded with one raw block, random bits (every block raw), one exponent (all coded)."""
    n = 3
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randn(n, 2, fmt.num_kv_heads, 16, fmt.head_dim, generator=gen).bfloat16()
    pages[0, 1, 0, 3, 7] = 0.0  # one raw block in a coded page
    pages[1] = _bits_to_bf16(torch.randint(0, 1 << 16, pages[1].shape, generator=gen).to(torch.int32))
    pages[2:] = (1 + torch.rand(pages[2:].shape, generator=gen)).bfloat16()  # one exponent: all coded
    return pages


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_pages_round_trip_and_agree_with_page_format(version: int, head_dim: int) -> None:
    fmt = PageFormat(head_dim, 2, version=version)
    pages = _pages(fmt, head_dim + version)
    encoded = page_codec.encode_pages(pages, fmt)
    for page, values in zip(encoded, pages, strict=True):
        assert torch.equal(page_codec.decode_page(page).view(torch.int16), values.view(torch.int16))
        assert page.stored_bytes == fmt.compressed_page_bytes(page.coded_blocks)
        assert page.meta_bytes == fmt.meta_bytes_per_page
        assert sum(page.page_head_bytes) == page.stored_bytes
    assert [p.stored_raw for p in encoded] == [False, True, False]
    assert 0 < encoded[0].coded_blocks < fmt.blocks_per_page
    assert encoded[2].coded_blocks == fmt.blocks_per_page
    assert encoded[1].stored_bytes == fmt.raw_page_bytes


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_a_page_head_encodes_as_it_sits_in_a_page(version: int) -> None:
    """The page-head API is the page format itself: its bytes are the page's bytes for that page-head."""
    fmt = PageFormat(128, 2, version=version)
    pages = _pages(fmt, 5)
    page = page_codec.encode_pages(pages, fmt)[0]
    start = 0
    for index in range(fmt.page_heads_per_page):
        kv, head = divmod(index, fmt.num_kv_heads)
        alone = page_codec.encode_page_head(pages[0, kv, head], kv, version)
        assert alone.stored_bytes == page.page_head_bytes[index]
        assert alone.coded_blocks == page.page_head_coded_blocks[index]
        if version >= 3:  # records side by side; patches after the last record
            record = page.data[index * 24 * 128 : (index + 1) * 24 * 128]
            assert torch.equal(alone.data[: 24 * 128], record)
        else:
            assert torch.equal(alone.data, page.data[start : start + alone.stored_bytes])
            assert torch.equal(alone.meta[4:], page.meta[index, 4:])
        start += alone.stored_bytes


def test_a_v3_page_with_more_raw_blocks_than_patches_is_stored_raw() -> None:
    fmt = PageFormat(256, 8, version=3)  # 512 blocks per page, at most 127 patches
    pages = torch.randn(1, 2, 8, 16, 256).bfloat16()
    pages[0, :, :, 0, :128:4] = 0.0  # 32 raw blocks per page-head x 16 = 512 > 127
    page = page_codec.encode_pages(pages, fmt)[0]
    assert page.stored_raw and page.coded_blocks == 0 and page.stored_bytes == fmt.raw_page_bytes
    assert torch.equal(page_codec.decode_page(page).view(torch.int16), pages[0].view(torch.int16))


@pytest.mark.parametrize(
    ("values", "kv", "version", "message"),
    [
        (torch.zeros(16, 64), 0, 3, "bf16"),
        (torch.zeros(16, 32).bfloat16(), 0, 3, "head_dim 32"),
        (torch.zeros(8, 64).bfloat16(), 0, 3, r"\[..., 16, 64\]"),
        (torch.zeros(16, 64).bfloat16(), 2, 3, "kv must be 0"),
        (torch.zeros(16, 64).bfloat16(), 0, 4, "version 4"),
    ],
)
def test_bad_input_is_refused_with_what_to_pass(
    values: torch.Tensor, kv: int, version: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        page_codec.encode_page_head(values, kv, version)


@pytest.mark.parametrize("version", [1, 2])
def test_v1_v2_pages_are_the_page_encoders_bytes(version: int) -> None:
    """encode_pages codes many v1/v2 pages in one call; each must be what reference.encode_page stores."""
    from zipkv.kernels.reference import pages as ref

    fmt = PageFormat(64, 3, version=version)
    pages = _pages(fmt, 9)
    for page, values in zip(page_codec.encode_pages(pages, fmt), pages, strict=True):
        data, meta = ref.encode_page(values, fmt)
        assert torch.equal(page.data, data) and torch.equal(page.meta, meta)

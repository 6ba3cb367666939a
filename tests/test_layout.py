"""The page format description (kernels/format/layout.py): sizes, geometry, metadata and the scalar rules."""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels.format import scalar_rules
from zipkv.kernels.format.layout import BlockGeometry, PageFormat
from zipkv.kernels.reference.pages import blocks_to_page, page_to_blocks


@pytest.mark.parametrize(
    ("head_dim", "blocks", "meta_bytes", "geometry"),
    [(64, 2, 8, "8x64"), (128, 4, 8, "4x128"), (256, 8, 16, "2x256")],
)
def test_sizes_per_head_dim(head_dim: int, blocks: int, meta_bytes: int, geometry: str) -> None:
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=8)
    assert fmt.blocks_per_page_head == blocks
    assert fmt.meta_bytes == meta_bytes
    assert fmt.k_geometry.name == geometry and fmt.v_geometry.name == geometry
    # 16 tokens x 8 heads x K,V x head_dim x 2 bytes
    assert fmt.raw_page_bytes == 16 * 8 * 2 * head_dim * 2
    assert fmt.min_page_bytes * 4 == fmt.raw_page_bytes * 3  # 12 of 16 bits


def test_llama_8b_page_and_expected_bytes() -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=8)
    assert fmt.raw_page_bytes == 65536 and fmt.min_page_bytes == 49152
    assert fmt.compressed_page_bytes(fmt.blocks_per_page) == 49152
    assert fmt.compressed_page_bytes(0) == 65536
    # 64 blocks: 60 compressed, 4 raw -> 60*768 + 4*1024
    assert fmt.compressed_page_bytes(60) == 50176
    assert fmt.expected_page_bytes(1.0) == 49152 + 16 * 8
    with pytest.raises(ValueError, match="outside"):
        fmt.compressed_page_bytes(65)


def test_raw_offsets_are_plain_layout() -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=4)
    # page-heads K h0..h3 then V h0..h3, each 16 x 128 bf16 = 4096 bytes
    assert fmt.raw_page_head_offset(0, 0) == 0
    assert fmt.raw_page_head_offset(0, 3) == 3 * 4096
    assert fmt.raw_page_head_offset(1, 0) == 4 * 4096


@pytest.mark.parametrize("geometry", ["4x128", "8x64", "16x32", "2x256"])
def test_block_of_matches_page_to_blocks(geometry: str) -> None:
    g = BlockGeometry.parse(geometry)
    head_dim = 256 if g.channels == 256 else 128
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=1, k_geometry=g, v_geometry=g)
    # Fill each position with a distinct value, cut into blocks, and check where each landed.
    ids = torch.arange(16 * head_dim, dtype=torch.float32).reshape(16, head_dim)
    blocks = page_to_blocks(ids, g)
    for token, channel in [(0, 0), (3, 127), (15, head_dim - 1), (7, 40)]:
        j = fmt.block_of(0, token, channel)
        assert (blocks[j] == ids[token, channel]).sum() == 1
    assert torch.equal(blocks_to_page(blocks, g, head_dim), ids)


def test_bad_shapes_fail_loudly() -> None:
    with pytest.raises(ValueError, match="head_dim 96"):
        PageFormat(head_dim=96, num_kv_heads=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        PageFormat(head_dim=128, num_kv_heads=0)
    with pytest.raises(ValueError, match="TOKENSxCHANNELS"):
        BlockGeometry.parse("4by128")
    with pytest.raises(ValueError, match="512"):
        BlockGeometry(4, 64)
    with pytest.raises(ValueError, match="does not tile"):
        PageFormat(head_dim=64, num_kv_heads=1, k_geometry=BlockGeometry(4, 128))
    with pytest.raises(ValueError, match="version"):
        PageFormat(head_dim=128, num_kv_heads=1, version=4)


def test_scalar_rules_worked_examples() -> None:
    # b = 120 and exponent 127: d = (127 - 120) >> 1 = 3; the kept low exponent bit is 1.
    bits = (0 << 15) | (127 << 7) | 0x55
    assert scalar_rules.code_nibble(bits, 120) == (0, 3)
    assert scalar_rules.restore_high_byte(0, 3, 60) == bits >> 8
    # Code byte 0xD0 = 1101_0000: value k sign 1, d 0; value k + C/2 sign 1, d 2. With b/2 = 63 the
    # high bytes are 0x80 | 63 = 0xBF and 0x80 | 65 = 0xC1.
    assert scalar_rules.pack_code_byte((1, 0), (1, 2)) == 0xD0
    assert scalar_rules.restore_high_byte(1, 0, 63) == 0xBF
    assert scalar_rules.restore_high_byte(1, 2, 63) == 0xC1


def test_block_base_span_edges() -> None:
    assert scalar_rules.block_base([120, 135]) == 120  # span exactly 16 exponents from b: fits
    assert scalar_rules.block_base([121, 135]) == 120  # b rounds down to even
    assert scalar_rules.block_base([121, 136]) is None  # 136 - 120 = 16: does not fit
    assert scalar_rules.block_base([0, 1, 15]) == 0
    assert scalar_rules.block_base([0, 16]) is None


def test_ascii_map_names_the_parts() -> None:
    text = PageFormat(head_dim=256, num_kv_heads=2).ascii_map()
    assert "m7" in text and "pad" in text and "2x256" in text and "131072" not in text
    assert "32768 B" in text  # 16 x 2 heads x 2 x 256 x 2 bytes


def test_v3_sizes() -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=8, version=3)
    assert (fmt.blocks_per_page_head, fmt.meta_bytes, fmt.block_values) == (16, 16, 128)
    assert fmt.raw_page_bytes == 65536 and fmt.min_page_bytes == 49152  # 16 page-heads x 3072
    # 256 blocks: 250 coded, 6 raw -> 16 records + 6 patches of 64 bytes
    assert fmt.compressed_page_bytes(250) == 49152 + 6 * 64
    assert fmt.compressed_page_bytes(0) == 65536  # every block raw: stored as a plain raw page
    assert fmt.compressed_page_bytes(256 - 128) == 65536  # more raw blocks than patch ranks: raw page
    assert fmt.expected_page_bytes(1.0) == 49152 + 256
    with pytest.raises(ValueError, match="one block geometry"):
        PageFormat(head_dim=128, num_kv_heads=1, version=3, k_geometry=BlockGeometry(4, 128))

"""The torch reference codec: every bf16 bit pattern, the worked examples, properties over random blocks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zipkv.kernels.format import layout, scalar_rules
from zipkv.kernels.format.layout import BlockGeometry
from zipkv.kernels.reference import pages as ref

ALL_BITS = torch.arange(65536, dtype=torch.int32)
GEOMETRIES = [BlockGeometry(4, 128), BlockGeometry(16, 32), BlockGeometry(1, 512)]


def bits_of(x: torch.Tensor) -> torch.Tensor:
    return ref.bf16_bits(x)


def values_of(bits: torch.Tensor) -> torch.Tensor:
    return ref._bits_to_bf16(bits)


def exponents(bits: torch.Tensor) -> torch.Tensor:
    return (bits >> 7) & 0xFF


def assert_round_trip(blocks: torch.Tensor, geometry: BlockGeometry) -> ref.EncodedBlocks:
    encoded = ref.encode_blocks(blocks, geometry)
    restored = ref.decode_blocks(encoded)
    assert restored.dtype == torch.bfloat16
    assert torch.equal(bits_of(restored), bits_of(blocks))
    return encoded


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.name)
def test_every_bit_pattern_round_trips_in_compressible_blocks(geometry: BlockGeometry) -> None:
    # Sorted by exponent, each block holds exponents 2m and 2m+1: all 128 blocks compress (b = 2m).
    order = torch.argsort(exponents(ALL_BITS), stable=True)
    blocks = values_of(ALL_BITS[order]).view(128, 512)
    encoded = assert_round_trip(blocks, geometry)
    assert torch.equal(encoded.markers, torch.arange(128, dtype=torch.uint8))
    assert encoded.nbytes == 128 * (layout.COMPRESSED_BLOCK_BYTES + 1)
    # Shuffled windows of 16 exponents [b, b+15] (the widest that compresses), every pattern again.
    gen = torch.Generator().manual_seed(1)
    for b in range(0, 241, 16):
        window = ALL_BITS[(exponents(ALL_BITS) >= b) & (exponents(ALL_BITS) < b + 16)]
        window = window[torch.randperm(window.numel(), generator=gen)].view(-1, 512)
        encoded = assert_round_trip(values_of(window), geometry)
        assert bool((encoded.markers == b // 2).all())


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.name)
def test_every_bit_pattern_round_trips_in_raw_blocks(geometry: BlockGeometry) -> None:
    gen = torch.Generator().manual_seed(2)
    blocks = values_of(ALL_BITS[torch.randperm(65536, generator=gen)]).view(128, 512)
    encoded = assert_round_trip(blocks, geometry)
    assert bool((encoded.markers == layout.RAW_MARKER).all())
    assert encoded.nbytes == 128 * (layout.RAW_BLOCK_BYTES + 1)
    assert not bool(ref.block_is_compressible(blocks).any())


def test_special_values_round_trip() -> None:
    specials = torch.tensor(
        [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001, 0x807F, 0x3F80], dtype=torch.int32
    )
    for fill in (0x0000, 0x7F80):  # with zeros (b = 0, raw: inf/NaN present) or with infinities (b = 254)
        bits = torch.full((512,), fill, dtype=torch.int32)
        bits[: specials.numel()] = specials
        assert_round_trip(values_of(bits).view(1, 512), BlockGeometry(4, 128))
    # Only inf/NaN (exponent 255) and the largest finite exponent 254: compressible with b = 254.
    bits = torch.tensor(
        [0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x7F7F, 0xFF00] * 85 + [0x7F80, 0x7F00], dtype=torch.int32
    )
    encoded = assert_round_trip(values_of(bits).view(1, 512), BlockGeometry(4, 128))
    assert encoded.markers.tolist() == [127]


def test_worked_example_b120_exponent127_gives_d3() -> None:
    bits = torch.full((4, 128), 120 << 7, dtype=torch.int32)  # exponent 120 everywhere: b = 120
    bits[0, 5] = (127 << 7) | 0x55  # exponent 127 at value (0, 5), paired with (0, 69)
    bits[0, 69] = 0x8000 | (121 << 7)  # negative, exponent 121: d = 0
    encoded = ref.encode_blocks(values_of(bits).view(1, 512), BlockGeometry(4, 128))
    assert encoded.markers.tolist() == [60]
    code = int(encoded.data[layout.LOW_BYTES + 5])
    assert code & 0x07 == 3  # d = (127 - 120) >> 1
    assert code >> 7 == 0 and (code >> 6) & 1 == 1 and (code >> 3) & 0x07 == 0
    assert code == scalar_rules.pack_code_byte(
        scalar_rules.code_nibble(int(bits[0, 5]), 120), scalar_rules.code_nibble(int(bits[0, 69]), 120)
    )
    assert int(encoded.data[5]) == int(bits[0, 5]) & 0xFF


def test_worked_example_code_byte_0xd0_restores_0xbf_and_0xc1() -> None:
    low = torch.arange(512, dtype=torch.int32) & 0xFF
    data = torch.cat([low, torch.full((256,), 0xD0, dtype=torch.int32)]).to(torch.uint8)
    encoded = ref.EncodedBlocks(
        data=data, markers=torch.tensor([63], dtype=torch.uint8), geometry=BlockGeometry(4, 128)
    )
    bits = bits_of(ref.decode_blocks(encoded)).view(4, 128)
    assert bool(((bits[:, :64] >> 8) == 0xBF).all())
    assert bool(((bits[:, 64:] >> 8) == 0xC1).all())
    assert torch.equal(bits & 0xFF, low.view(4, 128))
    assert (
        scalar_rules.restore_high_byte(1, 0, 63) == 0xBF and scalar_rules.restore_high_byte(1, 2, 63) == 0xC1
    )


@st.composite
def spanned_blocks(draw: st.DrawFn) -> tuple[torch.Tensor, int, int, float]:
    """A block whose exponents span exactly ``span`` from ``e_min`` (with a share of exact zeros)."""
    span = draw(st.sampled_from([14, 15, 16]))
    e_min = draw(st.integers(1, 255 - span))
    zero_share = draw(st.sampled_from([0.0, 0.0, 0.01, 0.5]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    e = torch.randint(e_min, e_min + span + 1, (512,), generator=gen, dtype=torch.int32)
    e[torch.randperm(512, generator=gen)[:2]] = torch.tensor([e_min, e_min + span], dtype=torch.int32)
    sign = torch.randint(0, 2, (512,), generator=gen, dtype=torch.int32)
    frac = torch.randint(0, 128, (512,), generator=gen, dtype=torch.int32)
    bits = (sign << 15) | (e << 7) | frac
    zeros = torch.rand(512, generator=gen) < zero_share
    bits[zeros] = sign[zeros] << 15  # +0 and -0: exponent 0
    return values_of(bits).view(1, 512), e_min, span, zero_share


@settings(max_examples=150, deadline=None)
@given(spanned_blocks(), st.sampled_from(GEOMETRIES))
def test_random_blocks_follow_the_rule_and_round_trip(
    case: tuple[torch.Tensor, int, int, float], geometry: BlockGeometry
) -> None:
    block, e_min, span, _ = case
    e = exponents(bits_of(block)).view(-1)
    expected = scalar_rules.block_base(e.tolist())
    if not bool((e == 0).any()):  # no zeros: the exponent span alone decides
        assert (expected is not None) == (span + (e_min & 1) < layout.EXPONENT_SPAN)
    assert bool(ref.block_is_compressible(block)[0]) == (expected is not None)
    encoded = assert_round_trip(block, geometry)
    marker = int(encoded.markers[0])
    assert marker == (layout.RAW_MARKER if expected is None else expected // 2)
    size = layout.RAW_BLOCK_BYTES if expected is None else layout.COMPRESSED_BLOCK_BYTES
    assert encoded.nbytes == size + 1


def test_codes_match_the_scalar_rules_of_layout() -> None:
    gen = torch.Generator().manual_seed(3)
    e = torch.randint(100, 116, (512,), generator=gen, dtype=torch.int32)
    bits = (torch.randint(0, 2, (512,), generator=gen, dtype=torch.int32) << 15) | (e << 7) | 0x2A
    geometry = BlockGeometry(16, 32)
    encoded = ref.encode_blocks(values_of(bits).view(1, 512), geometry)
    b = scalar_rules.block_base(exponents(bits).tolist())
    assert b is not None
    grid = bits.view(16, 32).tolist()
    want = [
        scalar_rules.pack_code_byte(
            scalar_rules.code_nibble(row[k], b), scalar_rules.code_nibble(row[k + 16], b)
        )
        for row in grid
        for k in range(16)
    ]
    assert encoded.data[layout.LOW_BYTES :].tolist() == want


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="bf16"):
        ref.encode_blocks(torch.zeros(3, 256, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16"):
        ref.encode_blocks(torch.zeros(3, 512))


def test_format_v2_pairs_low_bytes_and_keeps_codes() -> None:
    """v2 stores lo(t, k) and lo(t, k + C/2) side by side; codes, markers and sizes are v1's."""
    geometry = BlockGeometry(4, 128)
    gen = torch.Generator().manual_seed(11)
    values = (torch.randn(6, 512, generator=gen) * 3).bfloat16()
    values[5, 7] = 0.0  # one raw block
    v1 = ref.encode_blocks(values, geometry)
    v2 = ref.encode_blocks(values, geometry, paired=True)
    assert torch.equal(v1.markers, v2.markers) and v1.data.numel() == v2.data.numel()
    assert torch.equal(ref.decode_blocks(v2).view(torch.int16), values.view(torch.int16))
    bits = values.view(torch.int16).to(torch.int32) & 0xFFFF
    first = v2.data[:768].to(torch.int32)  # block 0 compresses
    assert int(v2.markers[0]) != 0xFF
    for t, k in ((0, 0), (1, 5), (3, 63)):
        assert int(first[t * 128 + 2 * k]) == int(bits[0, t * 128 + k]) & 0xFF
        assert int(first[t * 128 + 2 * k + 1]) == int(bits[0, t * 128 + k + 64]) & 0xFF
    assert torch.equal(v1.data[512:768], v2.data[512:768])  # codes
    last = v1.block_offsets()[5]
    assert torch.equal(v1.data[last:], v2.data[last:])  # the raw block is plain bf16 in both

"""Fused decode attention: compressed pages == the uncompressed twin bit for bit, and both match a float64
reference. Runs under the Triton interpreter on the CPU (fp32 dots, plain-integer restore) and compiled on
the GPU (bf16 dots, PTX restore); the ``gpu`` tests add the shapes and paths only a GPU runs.
"""

from __future__ import annotations

import pytest
import torch
from paged_cases import assert_mixed, make_case, rel_err, run_both

from zipkv.kernels.attention.decode import decode_attention, plan_decode
from zipkv.kernels.attention.plan_shape import choose_max_splits
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import BlockGeometry, PageFormat


@pytest.mark.parametrize(
    ("head_dim", "group", "kv_lens", "splits", "prefetch"),
    [(128, 4, [1, 37, 70], None, False), (128, 4, [130, 16], 1, True), (64, 8, [50, 33], None, False),
     (256, 1, [40], 3, True), (128, 1, [21, 64], None, True), (64, 4, [17], 1, False),
     (256, 8, [35, 2], None, False)],
)  # fmt: skip
@pytest.mark.parametrize("version", [1, 2, 3])
def test_compressed_equals_twin_and_reference(  # type: ignore[no-untyped-def]
    head_dim, group, kv_lens, splits, prefetch, version, device
) -> None:
    case = make_case(head_dim, 2, group, kv_lens, device, version=version)
    assert_mixed(case)
    plan = case.plan(block_n=32, max_splits=splits, num_sms=2, prefetch=prefetch)
    packed, twin = run_both(case, plan)
    assert torch.isfinite(packed.float()).all()
    assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
    assert rel_err(case, packed) < 1e-2


def test_a_wrong_code_bit_changes_the_output(device) -> None:  # type: ignore[no-untyped-def]
    case = make_case(128, 2, 4, [48], device, raw_fraction=0.0)
    pid = int(case.page_ids[0])
    case.heap[int(case.loc[pid]) + 512 + 3] ^= 0x04  # one code byte of K head 0, block 0: d changes
    packed, twin = run_both(case, case.plan(block_n=32, max_splits=1))
    assert not torch.equal(packed, twin)


@pytest.mark.parametrize("kv", [0, 1])
def test_v3_a_wrong_code_bit_or_patch_byte_changes_the_output(kv: int, device) -> None:  # type: ignore[no-untyped-def]
    """v3: one code bit of a coded block, or one patch byte of a raw block, read at a valid token."""
    case = make_case(128, 2, 4, [48], device, raw_fraction=0.0, version=3)
    pid = int(case.page_ids[0])
    head = kv * 2  # page-head 0 of K or of V
    assert int(case.meta[pid, head, 0]) < v3.RAW_BLOCK_FLAG, "block 0 must be coded"
    record = int(case.loc[pid]) + head * v3.page_head_bytes(128)
    case.heap[record + v3.code_byte_index(0, 3, 128)] ^= 0x04  # token 0, pair 3: d changes
    packed, twin = run_both(case, case.plan(block_n=32, max_splits=1))
    assert not torch.equal(packed, twin)

    case = make_case(128, 2, 4, [48], device, raw_fraction=0.3, seed=1, version=3)
    pid, rank = raw_block_in(case, kv)
    case.heap[int(case.loc[pid]) + 4 * v3.page_head_bytes(128) + v3.PATCH_BYTES * rank] ^= 0x01  # token 0
    packed, twin = run_both(case, case.plan(block_n=32, max_splits=1))
    assert not torch.equal(packed, twin)


def raw_block_in(case, kv: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(page id, patch rank) of a raw block of K (kv=0) or V in a coded page of the case's first request."""
    h = case.fmt.num_kv_heads
    for pid in case.page_ids[: int(case.indptr[1])].tolist():
        markers = case.meta[pid, kv * h : (kv + 1) * h].to(torch.int32).cpu()
        raw = (markers >= v3.RAW_BLOCK_FLAG) & (markers != v3.RAW_PAGE_MARKER)
        if raw.any():
            return pid, int(markers[raw][0]) & 0x7F
    raise AssertionError("the case holds no raw block in a coded page")


def test_split_kv_merge_matches_one_split(device) -> None:  # type: ignore[no-untyped-def]
    case = make_case(128, 2, 4, [200, 90], device, raw_fraction=0.1)
    one = run_both(case, case.plan(block_n=32, max_splits=1))[0]
    plan = case.plan(block_n=32, num_sms=8)
    assert plan.max_splits > 1 and int(plan.num_splits.max()) > 1
    many = run_both(case, plan)[0]
    assert rel_err(case, one) < 1e-2 and rel_err(case, many) < 1e-2
    assert float((one.float() - many.float()).abs().max()) < 2e-2


def test_plan_splits_cover_every_token_once() -> None:
    fmt = PageFormat(128, 8)
    lens = [1, 16, 63, 64, 65, 1000, 8192, 32768]
    counts = [-(-n // 16) for n in lens]
    ids = torch.arange(sum(counts), dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    plan = plan_decode(ids, indptr, torch.tensor(lens, dtype=torch.int32), fmt, 32, num_sms=132)
    for n, s, t in zip(lens, plan.num_splits.tolist(), plan.split_tokens.tolist(), strict=True):
        assert t % plan.block_n == 0 and 1 <= s <= plan.max_splits
        assert (s - 1) * t < n <= s * t  # no empty split, nothing left over


def test_split_count_fills_whole_waves() -> None:
    assert choose_max_splits(8, 528) == 66  # batch 1, 8 KV heads: one full wave
    assert choose_max_splits(256, 528) == 2  # batch 32
    assert choose_max_splits(1024, 528) == 1  # batch 128: enough programs already
    assert choose_max_splits(256, 396) == 3  # 768 programs = 2 waves of 396 nearly full


def test_hopper_split_count_stops_at_one_wave() -> None:
    """The Hopper plan looks no further than one wave (HOPPER_MAX_WAVES): 8 x 8192 on 132 SMs x 4 gets 8
    splits (512 programs), where the four-wave search takes 33 (2112 programs, each paying its start)."""
    assert choose_max_splits(64, 528, 128) == 33
    assert choose_max_splits(64, 528, 128, max_waves=1) == 8
    assert choose_max_splits(8, 528, 128, max_waves=1) == 66  # batch 1: one full wave
    assert choose_max_splits(256, 528, 128, max_waves=1) == 2
    assert choose_max_splits(1024, 528, 128, max_waves=1) == 1  # two waves of whole requests: no split


def test_bad_inputs_get_clear_errors() -> None:
    case = make_case(128, 2, 4, [20], "cpu")
    plan = case.plan(block_n=32)
    with pytest.raises(ValueError, match="q must be bf16"):
        decode_attention(plan, case.q.float(), case.heap, case.loc, case.meta, 0.1)
    with pytest.raises(ValueError, match="page_meta_layer"):
        decode_attention(plan, case.q, case.heap, case.loc, case.meta[:, :2], 0.1)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        decode_attention(plan, case.q, case.heap, case.loc.to("meta"), case.meta, 0.1)
    with pytest.raises(ValueError, match="token-major"):
        fmt = PageFormat(128, 2, k_geometry=BlockGeometry(16, 32))
        plan_decode(case.page_ids, case.indptr, case.kv_lens, fmt, 8)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        plan_decode(case.page_ids, case.indptr, case.kv_lens, case.fmt, 7)


@pytest.mark.parametrize(
    ("head_dim", "group", "kv_lens", "splits"),
    [(128, 4, [1, 37, 70], None), (64, 8, [50], 1), (256, 1, [40, 3], 2)],
)
def test_format_v2_equals_twin_and_v1(head_dim, group, kv_lens, splits, device) -> None:  # type: ignore[no-untyped-def]
    """Page format v2 (low bytes in code-byte pairs): same output bits as v1 pages and as the twin."""
    v1 = make_case(head_dim, 2, group, kv_lens, device, seed=3, version=1)
    v2 = make_case(head_dim, 2, group, kv_lens, device, seed=3, version=2)
    assert torch.equal(v1.pages.view(torch.int16), v2.pages.view(torch.int16))
    assert not torch.equal(v1.heap, v2.heap), "v2 must store compressed blocks differently"
    plan = v2.plan(block_n=32, max_splits=splits, num_sms=2)
    packed2, twin = run_both(v2, plan)
    packed1, _ = run_both(v1, v1.plan(block_n=32, max_splits=splits, num_sms=2))
    assert torch.equal(packed2.view(torch.int16), twin.view(torch.int16))
    assert torch.equal(packed2.view(torch.int16), packed1.view(torch.int16))
    # register double-buffering (loads one tile ahead): same bits, including a 1-token context
    prefetched, twin = run_both(v2, v2.plan(block_n=32, max_splits=splits, num_sms=2, prefetch=True))
    assert torch.equal(prefetched.view(torch.int16), twin.view(torch.int16))
    assert torch.equal(prefetched.view(torch.int16), packed1.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("version", [1, 2, 3])
def test_gpu_ptx_restore_equals_integer_restore_and_twin(head_dim: int, group: int, version: int) -> None:
    case = make_case(
        head_dim,
        4,
        group,
        [1, 300, 1000, 77],
        "cuda",
        raw_fraction=0.1,
        seed=head_dim + group,
        version=version,
    )
    for splits, prefetch in ((1, False), (None, True)):
        plan = case.plan(max_splits=splits, prefetch=prefetch)
        packed, twin = run_both(case, plan)
        plain = decode_attention(plan, case.q, case.heap, case.loc, case.meta, head_dim**-0.5, use_asm=False)
        assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
        assert torch.equal(packed.view(torch.int16), plain.view(torch.int16))
        assert rel_err(case, packed) < 1e-2

"""Fused extend attention: new tokens over their prefix pages (compressed == the uncompressed twin bit for
bit) and causally over themselves, against a float64 reference. Triton interpreter on the CPU (fp32 dots,
plain-integer restore), compiled on the GPU (bf16 dots, PTX restore)."""

from __future__ import annotations

import pytest
import torch
from paged_cases import Case, assert_mixed, make_case

from zipkv.kernels.attention.extend import ExtendPlan, extend_attention, plan_extend
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import BlockGeometry, PageFormat
from zipkv.kernels.reference.attention import extend_attention_reference


def extend_case(head_dim: int, group: int, prefix_lens: list[int], new_lens: list[int], device: str, **kw):  # type: ignore[no-untyped-def]
    """Prefix pages from `make_case` for the requests that have a prefix; the others own no page."""
    with_prefix = [n for n in prefix_lens if n > 0] or [1]
    case = make_case(head_dim, 2, group, with_prefix, device, **kw)
    counts, it = [], iter(case.indptr.diff().tolist())
    for n in prefix_lens:
        counts.append(next(it) if n > 0 else 0)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=device)
    case.page_ids = case.page_ids[: int(indptr[-1])]  # no prefix at all: none of the stand-in's pages
    g = torch.Generator().manual_seed(7)
    tokens = sum(new_lens)
    q = torch.randn(tokens, 2 * group, head_dim, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(tokens, 2, head_dim, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(tokens, 2, head_dim, generator=g).to(torch.bfloat16).to(device)
    return case, indptr, q, k, v


def counts(indptr: torch.Tensor) -> list[int]:
    return [int(n) for n in indptr.diff().tolist()]


def run_both(case: Case, plan: ExtendPlan, q, k, v):  # type: ignore[no-untyped-def]
    scale = case.fmt.head_dim**-0.5
    packed = extend_attention(plan, q, k, v, case.heap, case.loc, case.meta, scale)
    twin = extend_attention(
        plan, q, k, v, case.raw_heap, case.raw_loc, case.raw_meta, scale, compressed=False
    )
    return packed, twin


@pytest.mark.parametrize(
    ("head_dim", "group", "prefix_lens", "new_lens", "block_m"),
    [(128, 4, [37, 0, 64], [5, 20, 1], 4), (64, 8, [16], [33], 2), (256, 1, [50, 3], [2, 17], 16),
     (128, 4, [0, 0], [9, 3], 8)],
)  # fmt: skip
@pytest.mark.parametrize("version", [1, 2, 3])
def test_compressed_prefix_equals_twin_and_reference(  # type: ignore[no-untyped-def]
    head_dim, group, prefix_lens, new_lens, block_m, version, device
) -> None:
    case, indptr, q, k, v = extend_case(head_dim, group, prefix_lens, new_lens, device, version=version)
    if case.page_ids.numel() > 1:  # a one-page prefix holds one kind of page
        assert_mixed(case)
    plan = plan_extend(
        new_lens, prefix_lens, case.page_ids, counts(indptr), case.fmt, q.shape[1], block_m=block_m
    )
    packed, twin = run_both(case, plan, q, k, v)
    assert torch.isfinite(packed.float()).all()  # the NaN rows past each prefix never reach the output
    assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
    exp = extend_attention_reference(
        q, k, v, case.pages, case.page_ids, indptr, prefix_lens, new_lens, head_dim**-0.5
    )
    assert float((packed.double() - exp).norm() / exp.norm()) < 1e-2


def test_the_prefix_and_the_causal_mask_both_count(device) -> None:  # type: ignore[no-untyped-def]
    """Dropping the prefix, or letting a token see a later one, moves the output well past bf16 error."""
    case, indptr, q, k, v = extend_case(128, 4, [40], [12], device, seed=2)
    plan = plan_extend([12], [40], case.page_ids, counts(indptr), case.fmt, 8, block_m=4)
    out = run_both(case, plan, q, k, v)[0].double()
    scale = 128**-0.5
    no_prefix = extend_attention_reference(q, k, v, case.pages, case.page_ids, indptr, [0], [12], scale)
    assert float((out - no_prefix).norm() / no_prefix.norm()) > 0.1
    # Token 0 sees only the prefix and itself: changing a later token's K/V must not move its output.
    k2, v2 = k.clone(), v.clone()
    k2[5:], v2[5:] = -k2[5:], v2[5:] * 3
    out2 = run_both(case, plan, q, k2, v2)[0]
    assert torch.equal(out2[:5], out[:5].to(out2.dtype)) and not torch.equal(out2[5:], out[5:].to(out2.dtype))


def test_a_wrong_code_bit_in_the_prefix_changes_the_output(device) -> None:  # type: ignore[no-untyped-def]
    case, indptr, q, k, v = extend_case(128, 4, [48], [3], device, raw_fraction=0.0)
    pid = int(case.page_ids[0])
    case.heap[int(case.loc[pid]) + 512 + 3] ^= 0x04  # one code byte of K head 0, block 0
    plan = plan_extend([3], [48], case.page_ids, counts(indptr), case.fmt, 8)
    packed, twin = run_both(case, plan, q, k, v)
    assert not torch.equal(packed, twin)


def test_v3_a_wrong_code_bit_in_the_prefix_changes_the_output(device) -> None:  # type: ignore[no-untyped-def]
    case, indptr, q, k, v = extend_case(128, 4, [48], [3], device, raw_fraction=0.0, version=3)
    pid = int(case.page_ids[0])
    assert int(case.meta[pid, 2, 1]) < v3.RAW_BLOCK_FLAG, "V head 0's block 1 must be coded"
    record = int(case.loc[pid]) + 2 * v3.page_head_bytes(128)  # V head 0
    case.heap[record + v3.code_byte_index(5, 6, 128)] ^= 0x20  # token 5, pair 6: d of channel 70
    plan = plan_extend([3], [48], case.page_ids, counts(indptr), case.fmt, 8)
    packed, twin = run_both(case, plan, q, k, v)
    assert not torch.equal(packed, twin)


def test_bad_inputs_get_clear_errors() -> None:
    case, indptr, q, k, v = extend_case(128, 4, [20], [4], "cpu")
    with pytest.raises(ValueError, match="prefix longer than their pages"):
        plan_extend([4], [40], case.page_ids, counts(indptr), case.fmt, 8)
    with pytest.raises(ValueError, match="page ids"):
        plan_extend([4], [20], case.page_ids[:1], counts(indptr), case.fmt, 8)
    with pytest.raises(ValueError, match=">= 1 new token"):
        plan_extend([0], [20], case.page_ids, counts(indptr), case.fmt, 8)
    with pytest.raises(ValueError, match="block_m"):
        plan_extend([4], [20], case.page_ids, counts(indptr), case.fmt, 8, block_m=2)  # 2 x 4 rows < 16
    with pytest.raises(ValueError, match="token-major"):
        fmt = PageFormat(128, 2, k_geometry=BlockGeometry(16, 32))
        plan_extend([4], [20], case.page_ids, counts(indptr), fmt, 8)
    plan = plan_extend([4], [20], case.page_ids, counts(indptr), case.fmt, 8)
    with pytest.raises(ValueError, match="k must be bf16"):
        extend_attention(plan, q, k.float(), v, case.heap, case.loc, case.meta, 0.1)
    with pytest.raises(ValueError, match="covers 4 new tokens"):
        extend_attention(plan, q[:3], k[:3], v[:3], case.heap, case.loc, case.meta, 0.1)
    with pytest.raises(ValueError, match="page_meta_layer"):
        extend_attention(plan, q, k, v, case.heap, case.loc, case.meta[:, :2], 0.1)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        extend_attention(plan, q, k, v, case.heap, case.loc.to("meta"), case.meta, 0.1)
    with pytest.raises(ValueError, match="out must be bf16"):
        extend_attention(plan, q, k, v, case.heap, case.loc, case.meta, 0.1, out=q[:2].clone())


@pytest.mark.gpu
@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize(("head_dim", "group"), [(64, 8), (128, 4), (256, 1)])
def test_gpu_prefix_of_many_pages(head_dim, group, version) -> None:  # type: ignore[no-untyped-def]
    """Compiled: bf16 dots and the PTX restore, a prefix of many tiles and several query blocks."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; run on the GPU machine (docs/benchmarks.md)")
    prefix, new = [700, 130, 0], [64, 200, 33]
    case, indptr, q, k, v = extend_case(head_dim, group, prefix, new, "cuda", version=version)
    plan = plan_extend(new, prefix, case.page_ids, counts(indptr), case.fmt, q.shape[1])
    packed, twin = run_both(case, plan, q, k, v)
    assert torch.equal(packed.view(torch.int16), twin.view(torch.int16))
    exp = extend_attention_reference(q, k, v, case.pages, case.page_ids, indptr, prefix, new, head_dim**-0.5)
    assert float((packed.double() - exp).norm() / exp.norm()) < 1e-2

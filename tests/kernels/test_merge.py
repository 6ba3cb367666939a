"""The split-KV merge against a float64 log-sum-exp reference: requests with 1, a few, a chunk's worth and
more than one chunk of splits (the online rescale across chunks), head dims 64/128/256, and -inf lanes
of splits a request does not own (stale scratch of idle work items must never leak into the output)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zipkv.kernels.attention.merge import MAX_CHUNK_SPLITS, MIN_CHUNK_SPLITS, merge_shape, merge_splits
from zipkv.kernels.format.layout import PageFormat


def _reference(o_part: torch.Tensor, lse: torch.Tensor, n: list[int]) -> torch.Tensor:
    """o_part [B, Hq, S, D], lse [B, Hq, S]: request b's first n[b] splits, merged in float64."""
    out = torch.empty(o_part.shape[0], o_part.shape[1], o_part.shape[3], dtype=torch.float64)
    for b, k in enumerate(n):
        x = lse[b, :, :k].double()
        w = torch.exp2(x - x.max(dim=1, keepdim=True).values)
        out[b] = (w[:, :, None] * o_part[b, :, :k].double()).sum(1) / w.sum(1, keepdim=True)
    return out


def _scratch(
    splits: list[int],
    heads: int,
    head_dim: int,
    device: str,
    max_splits: int | None = None,
    program_items: torch.Tensor | None = None,
) -> tuple[SimpleNamespace, torch.Tensor]:
    """(a plan holding random partials of ``splits`` per request, laid out as split_plan.work_items lays
    them out, with a garbage idle item after each request; the float64 merge of them [B, Hq, D])."""
    batch, max_splits = len(splits), max(splits)
    o_req = torch.randn(batch, heads, max(splits), head_dim, device=device)
    lse_req = torch.randn(batch, heads, max(splits), device=device) * 8  # weights spanning 2^±24
    chunk = MIN_CHUNK_SPLITS if program_items is not None else MAX_CHUNK_SPLITS
    for b, k in enumerate(splits):
        if k > chunk:  # the largest weight in the last chunk: the earlier chunks must be rescaled
            lse_req[b, :, k - 1] = lse_req[b, :, : k - 1].max(dim=1).values + 3
    pairs = sum(splits) + batch
    o_part = torch.full((pairs, heads, head_dim), float("nan"), device=device)
    lse = torch.full((pairs, heads), 1e30, device=device)
    starts = [sum(splits[:b]) + b for b in range(batch)]
    for b, (k, first) in enumerate(zip(splits, starts, strict=True)):
        o_part[first : first + k] = o_req[b, :, :k].transpose(0, 1)
        lse[first : first + k] = lse_req[b, :, :k].transpose(0, 1)
    plan = SimpleNamespace(
        fmt=PageFormat(head_dim, 8), batch_size=batch, num_q_heads=heads,
        max_splits=max_splits or max(splits), program_items=program_items,
        o_partial=o_part, lse_partial=lse, num_splits=torch.tensor(splits, dtype=torch.int32, device=device),
        pair_start=torch.tensor(starts, dtype=torch.int32, device=device),
    )  # fmt: skip
    return plan, _reference(o_req.cpu(), lse_req.cpu(), splits)


@pytest.mark.parametrize(("head_dim", "splits"), [(128, [1, 7, 16, 66]), (64, [3, 130]), (256, [128, 2])])
def test_merge_matches_the_float64_log_sum_exp(head_dim, splits, device) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(head_dim)
    plan, ref = _scratch(splits, 4, head_dim, device)
    out = torch.empty(len(splits), 4, head_dim, dtype=torch.bfloat16, device=device)
    merge_splits(plan, out)  # type: ignore[arg-type]
    assert torch.isfinite(out.float()).all()
    err = (out.double().cpu() - ref).abs().max() / ref.abs().max()
    assert err < 8e-3, err


def test_merge_leaves_whole_requests_to_the_kernel(device) -> None:  # type: ignore[no-untyped-def]
    """skip_whole (the Hopper kernel wrote the rows of requests it did not split): those rows keep what is
    there, bit for bit; every split request is merged as without the flag."""
    torch.manual_seed(5)
    splits = [1, 3, 1, 2]
    plan, _ = _scratch(splits, 4, 128, device)
    merged = torch.empty(len(splits), 4, 128, dtype=torch.bfloat16, device=device)
    merge_splits(plan, merged)  # type: ignore[arg-type]
    written = torch.randn(len(splits), 4, 128, device=device).to(torch.bfloat16)  # the kernel's rows
    out = written.clone()
    merge_splits(plan, out, skip_whole=True)  # type: ignore[arg-type]
    for b, k in enumerate(splits):
        assert torch.equal(out[b], written[b] if k == 1 else merged[b]), (b, k)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_even_shares_merge_their_few_items_a_small_chunk_at_a_time(head_dim, device) -> None:  # type: ignore[no-untyped-def]
    """With even shares the plan's split bound is the program count (66 on an H200) while a request holds a
    few items: the merge takes the least chunk and a whole head a program, and a request of more items than
    a chunk (a long request among short ones) goes round the loop, rescaled across chunks like any other."""
    torch.manual_seed(head_dim)
    splits = [2, 1, MIN_CHUNK_SPLITS + 5, 3]
    items = torch.zeros(67, dtype=torch.int32, device=device)  # present: what marks an even-shares plan
    plan, ref = _scratch(splits, 4, head_dim, device, max_splits=66, program_items=items)
    bound_only, _ = _scratch(splits, 4, head_dim, device, max_splits=66)
    assert merge_shape(plan) == (MIN_CHUNK_SPLITS, head_dim)  # type: ignore[arg-type]
    assert merge_shape(bound_only)[0] > MIN_CHUNK_SPLITS  # type: ignore[arg-type]
    out = torch.empty(len(splits), 4, head_dim, dtype=torch.bfloat16, device=device)
    merge_splits(plan, out)  # type: ignore[arg-type]
    err = (out.double().cpu() - ref).abs().max() / ref.abs().max()
    assert torch.isfinite(out.float()).all() and err < 8e-3, err

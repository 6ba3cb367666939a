"""zipkv's SGLang attention logic on the CPU: SGLang-shaped batches in, attention out.

The decode path runs the real fused kernel under the Triton interpreter; SGLang's extend kernel (GPU only)
is replaced by a torch twin with its signature, named as such. Checked: decode over compressed pages equals
the uncompressed twin bit for bit and attention over the original KV within bf16 rounding; the CUDA-graph
path (static page table + recorded plan) equals the eager one; extend restores a compressed prefix.
"""

from __future__ import annotations

import os

import pytest
import torch

from zipkv.allocator import PagePool
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.attention import BatchView, ZipkvAttention
from zipkv.worker.engines.sglang.kvstore import ZipkvKV
from zipkv.worker.engines.sglang.slots import budget_bytes_for_tokens, virtual_pages_for_budget

if not torch.cuda.is_available():  # before the kernels are imported (lazily, by the decode path)
    os.environ.setdefault("TRITON_INTERPRET", "1")

# These tests build their pool and batches on the CPU and run the kernels under the interpreter; with CUDA
# present the compiled codec refuses CPU tensors (seen on the H200: bench/results/gpu_tests.txt). The same
# kernels are covered compiled by tests/kernels and tests/allocator there.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU-interpreter test; the compiled path is tested in tests/kernels"
)

FMT = PageFormat(head_dim=64, num_kv_heads=2)
LAYERS, HQ, SCALE = 2, 4, 0.125
LENS = [20, 37]


def extend_twin(q, k, v, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, causal, mask_indptr,
                max_len, k_scale, v_scale, sm_scale):  # type: ignore[no-untyped-def]  # fmt: skip
    """Torch twin of SGLang's extend_attention_fwd (prefix rows from the buffers, then causal new tokens)."""
    for b in range(qo_indptr.numel() - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        rows = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        keys = torch.cat([k_buf[rows], k[qs:qe]]).float()
        vals = torch.cat([v_buf[rows], v[qs:qe]]).float()
        o[qs:qe] = attend(q[qs:qe].float(), keys, vals, sm_scale, first_pos=rows.numel()).to(o.dtype)


def attend(q, keys, vals, sm_scale, first_pos):  # type: ignore[no-untyped-def]
    """q [n, Hq, D] at positions first_pos.., keys/vals [m, H, D]: causal GQA attention in float32."""
    group = q.shape[1] // keys.shape[1]
    keys, vals = keys.repeat_interleave(group, 1), vals.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, keys) * sm_scale
    pos = torch.arange(q.shape[0])[:, None] + first_pos
    scores = scores.masked_fill(torch.arange(keys.shape[0])[None, :] > pos, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), vals)


def setup(compression: bool = True):  # type: ignore[no-untyped-def]
    budget = budget_bytes_for_tokens(64 * PAGE_TOKENS, FMT, LAYERS)
    pool = PagePool(FMT, LAYERS, budget, chunk_bytes=4 * FMT.raw_page_bytes, compression=compression,
                    max_pages=virtual_pages_for_budget(budget, FMT, LAYERS, compression))  # fmt: skip
    alloc = ZipkvAllocator(pool, "cpu", compression)
    kv = ZipkvKV(pool, FMT, start_layer=0)
    req_to_token = torch.zeros(4, 64, dtype=torch.int32)
    return alloc, kv, req_to_token


def prefill(alloc, kv, req_to_token, lens, seed=0):  # type: ignore[no-untyped-def]
    """Allocate and write every request's tokens (as SGLang's extend would), then let the pages compress."""
    n = sum(lens)
    z = torch.zeros(len(lens), dtype=torch.int64)
    out = alloc.alloc_extend(z, z, torch.tensor(lens), torch.tensor(lens), z - 1, n)
    gen = torch.Generator().manual_seed(seed)
    keys = [
        torch.randn(n, FMT.num_kv_heads, FMT.head_dim, generator=gen).to(torch.bfloat16)
        for _ in range(LAYERS)
    ]
    vals = [
        torch.randn(n, FMT.num_kv_heads, FMT.head_dim, generator=gen).to(torch.bfloat16)
        for _ in range(LAYERS)
    ]
    start = 0
    for r, length in enumerate(lens):
        req_to_token[r + 1, :length] = out[start : start + length].to(torch.int32)
        start += length
    alloc.compress_step()
    for layer in range(LAYERS):
        kv.store(layer, out, keys[layer], vals[layer])
    for _ in range(3):
        alloc.compress_step()
    return keys, vals


def decode_view(lens: list[int]) -> BatchView:
    return BatchView(True, False, len(lens), torch.arange(1, len(lens) + 1), torch.tensor(lens), lens)


def test_decode_equals_twin_and_reference_and_graph_path() -> None:
    q = torch.randn(len(LENS), HQ * FMT.head_dim).to(torch.bfloat16)
    outs, setups = {}, {}
    for compressed in (True, False):  # zipkv, and the uncompressed twin over a pool that never compresses
        alloc, kv, r2t = setups[compressed] = setup(compression=compressed)
        keys, vals = prefill(alloc, kv, r2t, LENS)
        full = sum(n // PAGE_TOKENS for n in LENS)
        assert alloc.pool.stats().compressed_pages == (full if compressed else 0)
        attn = ZipkvAttention(kv, alloc, r2t, HQ, compressed, extend_twin)
        attn.begin_step(decode_view(LENS))
        outs[compressed] = attn.decode(q, layer_id=1, sm_scale=SCALE)
    assert torch.equal(outs[True], outs[False])  # lossless: the same bits as reading raw pages
    alloc, kv, r2t = setups[True]
    start = 0
    for b, length in enumerate(LENS):
        want = attend(q[b].view(1, HQ, -1).float(), keys[1][start : start + length].float(),
                      vals[1][start : start + length].float(), SCALE, first_pos=length - 1)  # fmt: skip
        torch.testing.assert_close(outs[True][b].float(), want.reshape(-1), atol=2e-2, rtol=2e-2)
        start += length
    graph = ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)
    graph.init_graph_state(max_bs=4, device=torch.device("cpu"))
    view = decode_view(LENS)
    graph.graph_fill_table(view)
    graph.graph_plan(view)
    assert torch.equal(graph.decode(q, layer_id=1, sm_scale=SCALE), outs[True])


def refuse_sglang_extend(*_: object) -> None:
    raise AssertionError("the fused extend must not call SGLang's extend kernel")


def extend_after_prefill(prefix: int, compression: bool, extend_kernel) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Prefill `prefix` tokens (full pages compressed), then extend 5 new tokens over them in layer 0:
    (the extend's output, the float reference)."""
    alloc, kv, r2t = setup(compression=compression)
    keys, vals = prefill(alloc, kv, r2t, [prefix])
    new = 5
    gen = torch.Generator().manual_seed(1)
    k_new, v_new = (
        torch.randn(new, FMT.num_kv_heads, FMT.head_dim, generator=gen).to(torch.bfloat16) for _ in "kv"
    )
    q = torch.randn(new, HQ * FMT.head_dim, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([prefix + new])
    out = alloc.alloc_extend(torch.tensor([prefix]), torch.tensor([prefix]), lens, lens,
                             r2t[1, prefix - 1 : prefix], new)  # fmt: skip
    r2t[1, prefix : prefix + new] = out.to(torch.int32)
    attn = ZipkvAttention(kv, alloc, r2t, HQ, compression, extend_kernel)
    view = BatchView(False, False, 1, torch.tensor([1]), lens, lens.tolist(), [prefix], [new])
    attn.begin_step(view)
    kv.store(0, out, k_new, v_new)
    got = attn.extend(q, k_new, v_new, layer_id=0, sm_scale=SCALE)
    want = attend(q.view(new, HQ, -1).float(), torch.cat([keys[0], k_new]).float(),
                  torch.cat([vals[0], v_new]).float(), SCALE, first_pos=prefix)  # fmt: skip
    return got, want.reshape(new, -1)


@pytest.mark.parametrize("prefix", [32, 37])  # whole pages; and a raw, partly filled last prefix page
def test_extend_reads_a_compressed_prefix(prefix: int, monkeypatch: pytest.MonkeyPatch) -> None:
    got, want = extend_after_prefill(prefix, True, extend_twin)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    monkeypatch.setenv("ZIPKV_EXTEND_KERNEL", "fused")  # the prefix pages read inside zipkv's extend kernel
    fused, want = extend_after_prefill(prefix, True, refuse_sglang_extend)
    torch.testing.assert_close(fused.float(), want, atol=2e-2, rtol=2e-2)
    twin, _ = extend_after_prefill(prefix, False, refuse_sglang_extend)  # a pool that never compresses
    assert torch.equal(fused, twin)


def test_a_malformed_extend_kernel_choice_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc, kv, r2t = setup()
    monkeypatch.setenv("ZIPKV_EXTEND_KERNEL", "fast")
    with pytest.raises(ValueError, match="ZIPKV_EXTEND_KERNEL='fast': expected one of restore, fused"):
        ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)


def test_a_malformed_split_plan_choice_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc, kv, r2t = setup()
    monkeypatch.setenv("ZIPKV_SPLIT_PLAN", "fast")
    with pytest.raises(ValueError, match="ZIPKV_SPLIT_PLAN='fast': expected one of kernel, torch"):
        ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)


def test_a_malformed_hopper_switch_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc, kv, r2t = setup()
    for name in ("ZIPKV_HOPPER_WARP_SOFTMAX", "ZIPKV_HOPPER_LAZY_RESCALE", "ZIPKV_HOPPER_LEAN"):
        monkeypatch.setenv(name, "yes")
        with pytest.raises(ValueError, match=f"{name}='yes'"):
            ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)
        monkeypatch.delenv(name)


def test_extend_metadata_needs_cpu_lengths() -> None:
    alloc, kv, r2t = setup()
    attn = ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)
    with pytest.raises(RuntimeError, match="disable_prefill_cuda_graph"):
        attn.begin_step(BatchView(False, False, 1, torch.tensor([1]), torch.tensor([4]), [4]))

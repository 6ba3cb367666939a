"""$ZIPKV_PREFILL_KERNEL: the choice is validated at start-up, ``flashinfer`` without the package fails
there with what to do; every extend, with a cached prefix or without, takes FlashInfer's prefill and equals
float32 causal GQA attention request by request (on the CPU through a named stand-in for the package,
tests/worker/flashinfer_standin.py; on the GPU, with flashinfer installed, through the real one), and the
restored prefix makes compression on and off give identical outputs."""

from __future__ import annotations

import sys

import flashinfer_standin
import pytest
import torch
from flashinfer_standin import attend_lse
from test_sglang_backend import attend  # causal GQA attention in float32, on the CPU

from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engines.sglang.flashinfer_prefill import (
    PREFILL_KERNEL_ENV,
    FlashInferPrefill,
    PrefixPages,
    merge_lse,
    prefill_kernel_choice,
    resolve_prefill_kernel,
)


def test_the_choice_is_validated() -> None:
    assert prefill_kernel_choice({}) == "auto"
    assert prefill_kernel_choice({PREFILL_KERNEL_ENV: "triton"}) == "triton"
    assert prefill_kernel_choice({PREFILL_KERNEL_ENV: " FlashInfer "}) == "flashinfer"
    with pytest.raises(
        ValueError, match="ZIPKV_PREFILL_KERNEL='fast': expected one of auto, triton, flashinfer"
    ):
        prefill_kernel_choice({PREFILL_KERNEL_ENV: "fast"})


# The backend tests build their pool on the CPU under the interpreter (tests/worker/test_sglang_backend.py).
cpu_pool = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter pool, as in that module")


@cpu_pool
def test_the_backend_refuses_a_malformed_choice_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_sglang_backend import HQ, extend_twin, setup

    from zipkv.worker.engines.sglang.attention import ZipkvAttention

    alloc, kv, r2t = setup()
    monkeypatch.setenv(PREFILL_KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="ZIPKV_PREFILL_KERNEL='fast'"):
        ZipkvAttention(kv, alloc, r2t, HQ, True, extend_twin)


def test_auto_takes_flashinfer_only_on_a_cuda_device_that_has_it() -> None:
    table = [
        ("auto", "cuda", True, "flashinfer"),
        ("auto", "cuda", False, "triton"),
        ("auto", "cpu", True, "triton"),
        ("triton", "cuda", True, "triton"),
        ("flashinfer", "cpu", False, "flashinfer"),  # explicit: kept, and fails loudly if it cannot run
    ]
    for choice, device_type, have, want in table:
        assert resolve_prefill_kernel(choice, device_type, have) == want, (choice, device_type, have)


def test_flashinfer_missing_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer raises ImportError
    with pytest.raises(RuntimeError, match=r"needs the flashinfer package .* unset ZIPKV_PREFILL_KERNEL"):
        FlashInferPrefill(8, 2, 64, torch.device("cpu"))


def test_merging_two_partial_attentions_gives_attention_over_both() -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 4, 32, generator=gen)
    keys, vals = torch.randn(40, 2, 32, generator=gen), torch.randn(40, 2, 32, generator=gen)
    want, _ = attend_lse(q, keys, vals, 0.2, causal=False)
    for split in (0, 13, 40):  # one side empty (lse -inf) at either end
        o_a, s_a = attend_lse(q, keys[:split], vals[:split], 0.2, causal=False)
        o_b, s_b = attend_lse(q, keys[split:], vals[split:], 0.2, causal=False)
        torch.testing.assert_close(merge_lse(o_a, s_a, o_b, s_b), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flashinfer_standin.merge_state(o_a, s_a, o_b, s_b)[0], want, atol=1e-5,
                                   rtol=1e-5)  # fmt: skip


def test_the_last_page_holds_what_is_left_of_the_prefix() -> None:
    assert PrefixPages([3, 0, 1], [37, 0, 16]).last_page_tokens() == [5, 0, 16]


def _restored(prefix_tokens: list[int], gen: torch.Generator, hkv: int, head_dim: int, device: str):  # type: ignore[no-untyped-def]
    """Random prefixes laid out as kvstore.read_pages restores them: (pages bf16 [n, 2, Hkv, 16, D],
    per request (keys, values) [t, Hkv, D])."""
    counts = [-(-t // PAGE_TOKENS) for t in prefix_tokens]
    pages = torch.randn(sum(counts), 2, hkv, PAGE_TOKENS, head_dim, generator=gen, device=device).bfloat16()
    per_request, first = [], 0
    for c, t in zip(counts, prefix_tokens, strict=True):
        kv = pages[first : first + c].permute(1, 0, 3, 2, 4).reshape(2, -1, hkv, head_dim)[:, :t]
        per_request.append((kv[0], kv[1]))
        first += c
    return counts, pages, per_request


def _check_against_float(device: str, heads: tuple[int, int], head_dim: int) -> None:
    """Requests with no prefix, a partial last prefix page, whole pages and a long prefix in one batch."""
    hq, hkv = heads
    prefix_tokens, new_tokens = [0, 37, 16, 300], [5, 1, 17, 64]
    gen = torch.Generator(device=device).manual_seed(head_dim)
    counts, pages, prefixes = _restored(prefix_tokens, gen, hkv, head_dim, device)
    n = sum(new_tokens)
    q, k, v = (torch.randn(n, h, head_dim, generator=gen, device=device).bfloat16() for h in (hq, hkv, hkv))
    qo = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    prefill = FlashInferPrefill(hq, hkv, head_dim, torch.device(device))
    prefill.plan(qo, PrefixPages(counts, prefix_tokens))
    scale = head_dim**-0.5
    out = prefill.run(q, k, v, scale, pages)
    for b, (pk, pv) in enumerate(prefixes):
        s, e = int(qo[b]), int(qo[b + 1])
        keys, vals = torch.cat([pk, k[s:e]]).float().cpu(), torch.cat([pv, v[s:e]]).float().cpu()
        want = attend(q[s:e].float().cpu(), keys, vals, scale, first_pos=prefix_tokens[b])
        torch.testing.assert_close(out[s:e].float().cpu(), want, atol=2e-2, rtol=2e-2)
    prefill.plan(qo)  # no prefix: the ragged prefill alone, causal per request
    out = prefill.run(q, k, v, scale)
    for b in range(len(new_tokens)):
        s, e = int(qo[b]), int(qo[b + 1])
        want = attend(q[s:e].float().cpu(), k[s:e].float().cpu(), v[s:e].float().cpu(), scale, first_pos=0)
        torch.testing.assert_close(out[s:e].float().cpu(), want, atol=2e-2, rtol=2e-2)


def test_the_prefill_is_attention_over_prefix_and_new_tokens_on_the_standin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())
    _check_against_float("cpu", (8, 2), 32)


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((8, 8), 64), ((16, 2), 256)])
def test_flashinfer_prefill_is_attention_over_prefix_and_new_tokens(
    heads: tuple[int, int], head_dim: int
) -> None:
    pytest.importorskip("flashinfer", reason="FlashInfer is installed with SGLang (the e2e carry)")
    _check_against_float("cuda", heads, head_dim)


@cpu_pool
def test_prefix_free_extends_are_planned_once_and_run_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_sglang_backend import FMT, HQ, SCALE, refuse_sglang_extend, setup

    from zipkv.worker.engines.sglang.attention import BatchView, ZipkvAttention

    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())
    monkeypatch.setenv(PREFILL_KERNEL_ENV, "flashinfer")
    alloc, kv, r2t = setup()
    attn = ZipkvAttention(kv, alloc, r2t, HQ, True, refuse_sglang_extend)
    assert attn.flashinfer is not None
    lens = [3, 5]
    attn.begin_step(BatchView(False, False, 2, torch.tensor([1, 2]), torch.tensor(lens), lens, [0, 0], lens))
    q = torch.randn(8, HQ * FMT.head_dim).bfloat16()
    k, v = (torch.randn(8, FMT.num_kv_heads, FMT.head_dim).bfloat16() for _ in "kv")
    for layer in range(2):
        assert attn.extend(q, k, v, layer_id=layer, sm_scale=SCALE).shape == q.shape
    ragged, paged = attn.flashinfer.ragged, attn.flashinfer.paged
    assert ragged.plans == [([0, 3, 8], [0, 3, 8])] and paged.plans == []  # planned once per step


@cpu_pool
@pytest.mark.parametrize("prefix", [32, 37])  # whole pages; and a raw, partly filled last prefix page
def test_an_extend_over_a_compressed_prefix_takes_flashinfer(
    prefix: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's kernel refuses to run; the prefix is restored from compressed pages, attended by the paged
    prefill and merged; a pool that never compresses gives the same bits."""
    from test_sglang_backend import extend_after_prefill, refuse_sglang_extend

    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())
    monkeypatch.setenv(PREFILL_KERNEL_ENV, "flashinfer")
    got, want = extend_after_prefill(prefix, True, refuse_sglang_extend)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    twin, _ = extend_after_prefill(prefix, False, refuse_sglang_extend)
    assert torch.equal(got, twin)

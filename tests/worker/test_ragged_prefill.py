"""$ZIPKV_PREFILL_KERNEL: the choice is validated at start-up, ``flashinfer`` without the package fails
there with what to do, and (on the GPU, with flashinfer installed) FlashInfer's ragged prefill equals
float32 causal GQA attention request by request."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
from test_sglang_backend import attend  # causal GQA attention in float32, on the CPU

from zipkv.worker.engines.sglang.ragged_prefill import (
    PREFILL_KERNEL_ENV,
    RaggedPrefill,
    prefill_kernel_choice,
)


def test_the_choice_is_validated() -> None:
    assert prefill_kernel_choice({}) == "triton"
    assert prefill_kernel_choice({PREFILL_KERNEL_ENV: " FlashInfer "}) == "flashinfer"
    with pytest.raises(ValueError, match="ZIPKV_PREFILL_KERNEL='fast': expected one of triton, flashinfer"):
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


def test_flashinfer_missing_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer raises ImportError
    with pytest.raises(RuntimeError, match=r"needs the flashinfer package .* unset ZIPKV_PREFILL_KERNEL"):
        RaggedPrefill(8, 2, 64, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((8, 8), 64), ((16, 2), 256)])
def test_ragged_prefill_is_causal_attention_per_request(heads: tuple[int, int], head_dim: int) -> None:
    pytest.importorskip("flashinfer", reason="FlashInfer is installed with SGLang (the e2e carry)")
    hq, hkv = heads
    lens = [1, 17, 300, 64]
    n = sum(lens)
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v = (torch.randn(n, h, head_dim, device="cuda", generator=gen).bfloat16() for h in (hq, hkv, hkv))
    qo = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ragged = RaggedPrefill(hq, hkv, head_dim, torch.device("cuda"))
    ragged.plan(qo)
    scale = head_dim**-0.5
    out = ragged.run(q, k, v, scale)
    for b in range(len(lens)):
        s, e = int(qo[b]), int(qo[b + 1])
        want = attend(q[s:e].float().cpu(), k[s:e].float().cpu(), v[s:e].float().cpu(), scale, first_pos=0)
        torch.testing.assert_close(out[s:e].float().cpu(), want, atol=2e-2, rtol=2e-2)


class RecordingRagged:
    """Stand-in for RaggedPrefill on the CPU (FlashInfer runs only on a GPU), named as such: it records the
    plan and answers each run with causal attention per planned request, so the routing is what is tested."""

    def __init__(self) -> None:
        self.plans: list[list[int]] = []
        self.runs = 0

    def plan(self, qo_indptr: torch.Tensor) -> None:
        self.plans.append(qo_indptr.tolist())

    def run(self, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, sm_scale: float) -> torch.Tensor:
        self.runs += 1
        bounds = self.plans[-1]
        return torch.cat([attend(q3[s:e].float(), k3[s:e].float(), v3[s:e].float(), sm_scale, first_pos=0)
                          for s, e in itertools.pairwise(bounds)]).to(q3.dtype)  # fmt: skip


@cpu_pool
def test_prefix_free_extends_take_the_ragged_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_sglang_backend import FMT, HQ, SCALE, extend_after_prefill, refuse_sglang_extend, setup

    from zipkv.worker.engines.sglang.attention import BatchView, ZipkvAttention

    recorder = RecordingRagged()
    monkeypatch.setattr(ZipkvAttention, "_ragged_prefill", staticmethod(lambda *a: recorder))
    alloc, kv, r2t = setup()
    attn = ZipkvAttention(kv, alloc, r2t, HQ, True, refuse_sglang_extend)
    lens = [3, 5]
    attn.begin_step(BatchView(False, False, 2, torch.tensor([1, 2]), torch.tensor(lens), lens, [0, 0], lens))
    q = torch.randn(8, HQ * FMT.head_dim).bfloat16()
    k, v = (torch.randn(8, FMT.num_kv_heads, FMT.head_dim).bfloat16() for _ in "kv")
    for layer in range(2):
        out = attn.extend(q, k, v, layer_id=layer, sm_scale=SCALE)
        assert out.shape == q.shape
    assert recorder.plans == [[0, 3, 8]] and recorder.runs == 2  # planned once per step, run per layer
    # An extend over a cached prefix reads pages: it keeps SGLang's kernel (here its torch twin).
    from test_sglang_backend import extend_twin

    got, want = extend_after_prefill(32, True, extend_twin)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    assert recorder.runs == 2

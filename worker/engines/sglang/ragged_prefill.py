"""New-token attention for extends with no cached prefix, through FlashInfer's ragged prefill.

An extend whose requests have no prefix reads no KV page: it is plain causal attention over the batch's
own new tokens, so the page format plays no part in it. zipkv ran it with SGLang's Triton extend kernel,
and on the H200 (64 x 8192 prompts, docs/benchmarks.md) that made zipkv's mean TTFT 9.96 s against 8.51 s
for SGLang's FlashInfer backend, the same gap SGLang's own Triton backend shows. ``ZIPKV_PREFILL_KERNEL=
flashinfer`` runs the kernel SGLang's FlashInfer backend runs for it, planned once per step and called as
that backend calls it. Compression on and off take the same path, so greedy tokens stay identical.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

PREFILL_KERNEL_ENV = "ZIPKV_PREFILL_KERNEL"
PREFILL_KERNELS = ("triton", "flashinfer")
WORKSPACE_BYTES = 128 << 20  # FlashInfer's float workspace (SGLang's backend allocates its own likewise)


def prefill_kernel_choice(env: Mapping[str, str] | None = None) -> str:
    """``$ZIPKV_PREFILL_KERNEL``: ``triton`` (default: SGLang's Triton extend kernel) or ``flashinfer``."""
    env = os.environ if env is None else env
    choice = env.get(PREFILL_KERNEL_ENV, "triton").strip().lower()
    if choice not in PREFILL_KERNELS:
        raise ValueError(f"{PREFILL_KERNEL_ENV}={choice!r}: expected one of {', '.join(PREFILL_KERNELS)}")
    return choice


class RaggedPrefill:
    """FlashInfer's ``BatchPrefillWithRaggedKVCacheWrapper`` for one engine: ``plan`` once per extend step,
    ``run`` per layer."""

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, device: torch.device) -> None:
        try:
            import flashinfer
        except ImportError as e:
            raise RuntimeError(
                f"{PREFILL_KERNEL_ENV}=flashinfer needs the flashinfer package (SGLang's FlashInfer backend "
                f"installs it): {e}. Install it or unset {PREFILL_KERNEL_ENV} to use SGLang's Triton extend."
            ) from e
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")

    def plan(self, qo_indptr: torch.Tensor) -> None:
        """``qo_indptr``: int32 [B + 1] on the device, request b's new tokens (and keys) at its rows."""
        self.wrapper.begin_forward(
            qo_indptr, qo_indptr, self.num_q_heads, self.num_kv_heads, self.head_dim,
            q_data_type=torch.bfloat16,
        )  # fmt: skip

    def run(self, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """bf16 [N, Hq, D] causal attention of q3 [N, Hq, D] over k3, v3 [N, Hkv, D], request by request."""
        return self.wrapper.forward(q3, k3, v3, causal=True, sm_scale=sm_scale)

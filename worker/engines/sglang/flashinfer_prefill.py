"""Extend attention through FlashInfer's prefill kernels, as SGLang's FlashInfer backend runs them.

FlashInfer takes every extend off SGLang's Triton extend kernel (``ZIPKV_PREFILL_KERNEL``: ``auto``, the
default, on a CUDA device with the flashinfer package; ``flashinfer`` always; ``triton`` never):
- no cached prefix: plain causal attention over the batch's own new tokens (FlashInfer's ragged prefill);
  no KV page is read, so the page format plays no part;
- a cached prefix (chunked prefill's later chunks, radix hits): the prefix pages are restored bit-exactly
  into a scratch buffer (kvstore.read_pages, one pass over the prefix), FlashInfer's paged prefill attends
  the new tokens over them (page size 16, the scratch's HND layout as it comes), the ragged prefill attends
  them over themselves, and the two partial results are merged by their log-sum-exp, as SGLang's backend
  merges its ragged and paged halves.
Prefill is compute-bound (each chunk's new tokens against its whole prefix), so the restore pass is small
next to the attention; on the Mooncake trace an 87k-token prompt's later chunks took 2-3 s each through
SGLang's Triton extend kernel against ~1 s in SGLang's FlashInfer backend (docs/benchmarks.md, "Serving
under SLO"). Compression on and off take the same path over the same restored bf16 values, so greedy tokens
stay identical.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from zipkv.kernels.env_choice import env_choice
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat

PREFILL_KERNEL_ENV = "ZIPKV_PREFILL_KERNEL"
PREFILL_KERNELS = ("auto", "triton", "flashinfer")
WORKSPACE_BYTES = 128 << 20  # FlashInfer's float workspace, for both wrappers (they run one after another)
MERGE_KERNEL_THREADS = 1024  # FlashInfer's merge_state launches heads x (head_dim / vec) threads per block


def prefill_kernel_choice(env: Mapping[str, str] | None = None) -> str:
    """``$ZIPKV_PREFILL_KERNEL``: ``auto`` (the default), ``triton`` (SGLang's Triton extend kernel) or
    ``flashinfer``; anything else is refused."""
    return env_choice(PREFILL_KERNEL_ENV, PREFILL_KERNELS, "auto", env)


def resolve_prefill_kernel(choice: str, device_type: str, have_flashinfer: bool) -> str:
    """``auto`` -> ``flashinfer`` on a CUDA device where the package is installed (SGLang's FlashInfer
    backend installs it), else ``triton``. FlashInfer is the default because on the Mooncake trace it
    took an 87k-token prompt's later chunks from 2-3 s to SGLang's ~1 s and zipkv's strict goodput from
    0.03 to 0.26 req/s (H100, docs/benchmarks.md); an explicit choice is kept as it is."""
    if choice != "auto":
        return choice
    return "flashinfer" if device_type == "cuda" and have_flashinfer else "triton"


@dataclass(frozen=True)
class PrefixPages:
    """Where an extend's prefixes lie in the restored scratch: request b's pages follow request b - 1's."""

    page_counts: Sequence[int]  # pages per request (0: no prefix)
    prefix_tokens: Sequence[int]  # prefix tokens per request

    def last_page_tokens(self) -> list[int]:
        pairs = zip(self.page_counts, self.prefix_tokens, strict=True)
        return [tokens - PAGE_TOKENS * (count - 1) if count else 0 for count, tokens in pairs]


def merge_lse(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over keys A and B from the attention over each: o [N, H, D], lse float32 [N, H] in base 2
    (FlashInfer's). A row with no key on one side (lse -inf) takes the other side's output as it is."""
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # both empty: weights 0, output 0
    w_a, w_b = torch.exp2(lse_a - top), torch.exp2(lse_b - top)
    total = (w_a + w_b).clamp_min(torch.finfo(torch.float32).tiny)
    merged = o_a.float() * (w_a / total)[..., None] + o_b.float() * (w_b / total)[..., None]
    return merged.to(o_a.dtype)


class FlashInferPrefill:
    """FlashInfer's ragged and paged prefill wrappers for one engine: ``plan`` once per extend step, ``run``
    per layer."""

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
        self.ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        # kvstore.read_pages restores pages as bf16 [n, 2, H, 16, D]: FlashInfer's 5-D HND paged layout
        self.paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND")
        vec = max(16 // 2, head_dim // 32)  # bf16: FlashInfer's vector width in merge_state
        fits = (
            num_q_heads * (head_dim // vec) <= MERGE_KERNEL_THREADS
        )  # else its launch fails: merge in torch
        self._merge = flashinfer.merge_state if fits else None
        self.has_prefix = False

    def plan(self, qo_indptr: torch.Tensor, prefix: PrefixPages | None = None) -> None:
        """``qo_indptr``: int32 [B + 1] on the device, request b's new tokens (and keys) at its rows."""
        self.ragged.begin_forward(
            qo_indptr, qo_indptr, self.num_q_heads, self.num_kv_heads, self.head_dim,
            q_data_type=torch.bfloat16,
        )  # fmt: skip
        self.has_prefix = prefix is not None
        if prefix is None:
            return
        device = qo_indptr.device
        counts = torch.tensor([0, *prefix.page_counts], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.paged.begin_forward(
            qo_indptr, counts.to(device), torch.arange(int(counts[-1]), dtype=torch.int32, device=device),
            torch.tensor(prefix.last_page_tokens(), dtype=torch.int32, device=device),
            self.num_q_heads, self.num_kv_heads, self.head_dim, PAGE_TOKENS,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )  # fmt: skip

    def run(
        self,
        q3: torch.Tensor,
        k3: torch.Tensor,
        v3: torch.Tensor,
        sm_scale: float,
        prefix_pages: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """bf16 [N, Hq, D]: q3 [N, Hq, D] over its request's prefix (``prefix_pages``: the restored scratch,
        bf16 [n, 2, Hkv, 16, D], when planned with one) and causally over k3, v3 [N, Hkv, D]."""
        if not self.has_prefix:
            return self.ragged.forward(q3, k3, v3, causal=True, sm_scale=sm_scale)
        if prefix_pages is None:
            raise RuntimeError("planned with a prefix: run needs its restored pages")
        o_new, lse_new = self.ragged.forward_return_lse(q3, k3, v3, causal=True, sm_scale=sm_scale)
        o_pre, lse_pre = self.paged.forward_return_lse(q3, prefix_pages, causal=False, sm_scale=sm_scale)
        if self._merge is not None:
            return self._merge(o_pre, lse_pre, o_new, lse_new)[0]
        return merge_lse(o_pre, lse_pre, o_new, lse_new)


def have_module(name: str) -> bool:
    """Whether ``import name`` would find the module, without importing it (one already imported counts;
    a module set to None in sys.modules, as tests do to hide one, does not)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return False


def flashinfer_prefill_for(
    num_q_heads: int, fmt: PageFormat, device: torch.device
) -> FlashInferPrefill | None:
    """FlashInfer's prefill for every extend of an engine, unless $ZIPKV_PREFILL_KERNEL says ``triton`` or
    ``auto`` finds no CUDA device or no flashinfer package (resolve_prefill_kernel); None: SGLang's Triton
    extend. A malformed choice fails here, at start-up."""
    choice = resolve_prefill_kernel(prefill_kernel_choice(), device.type, have_module("flashinfer"))
    if choice != "flashinfer":
        return None
    return FlashInferPrefill(num_q_heads, fmt.num_kv_heads, fmt.head_dim, device)

"""zipkv's attention inside SGLang: fused decode over compressed pages, extend for the new tokens.

No sglang import here: `seams` subclasses SGLang's ``AttentionBackend`` and ``KVCache``, turns each
``ForwardBatch`` into a `BatchView` and calls into this module.

- **Store**: new tokens go into their raw pages (`ZipkvKV`, kvstore.py).
- **Decode**: one `plan_decode` per step (every layer reuses it); the page list is read from SGLang's
  ``req_to_token`` in a padded layout (``max_pages`` per request, ``page_indptr = b * max_pages``) so that its
  shape is static and the whole plan is recorded into SGLang's decode CUDA graph. ``compressed=False`` is the
  uncompressed twin: the same kernel source reading every page as raw.
- **Extend** (prefill, chunked prefill, prefix hits): attention for the new tokens with FlashInfer's ragged
  and paged prefill (flashinfer_prefill.py; the default on a CUDA device with flashinfer installed), or with
  ``ZIPKV_PREFILL_KERNEL=triton`` SGLang's Triton extend kernel; a prefix (chunked prefill, radix hit) is
  restored from its pages into a scratch buffer first, or, with ``ZIPKV_EXTEND_KERNEL=fused``, read from its
  pages inside zipkv's extend kernel (kernels/attention/extend.py: compressed tiles restored in registers,
  no scratch copy).
- **Compression**: at the start of every forward step, `ZipkvAllocator.compress_step` marks the pages the
  previous step filled and runs the pool's step (one encode launch for all of them, all layers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.flashinfer_prefill import (
    PrefixPages,
    flashinfer_prefill_for,
)
from zipkv.worker.engines.sglang.kvstore import ZipkvKV
from zipkv.worker.engines.sglang.slots import to_device

if TYPE_CHECKING:  # the kernels import Triton: loaded on first use
    from zipkv.kernels.attention.extend import ExtendPlan


@dataclass(frozen=True)
class BatchView:
    """What zipkv reads from SGLang's ForwardBatch (tensors on the device unless named _cpu)."""

    is_decode: bool
    is_idle: bool
    batch_size: int
    req_pool_indices: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int32/int64 [B]: tokens per request including this step's
    seq_lens_cpu: list[int] | None
    extend_prefix_lens_cpu: list[int] | None = None  # extend only
    extend_seq_lens_cpu: list[int] | None = None  # extend only


def page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, max_pages: int) -> torch.Tensor:
    """int32 [B, max_pages]: page id of each request's pages (entries past a request's length: stale)."""
    return (req_to_token[req_pool_indices][:, ::PAGE_TOKENS][:, :max_pages] // PAGE_TOKENS).to(torch.int32)


@dataclass(frozen=True)
class _Prefix:
    page_ids: torch.Tensor  # int64 [n]: all prefix pages of the batch, request by request
    kv_indptr: torch.Tensor  # int32 [B + 1]: prefix tokens per request
    kv_indices: torch.Tensor  # int64 [sum prefix]: each prefix token's row in the restored scratch


@dataclass(frozen=True)
class _Extend:
    qo_indptr: torch.Tensor  # int32 [B + 1]
    max_extend_tokens: int
    prefix: _Prefix | None  # for SGLang's Triton extend kernel over the restored prefix
    fused: ExtendPlan | None = None  # when zipkv's extend kernel reads the prefix ($ZIPKV_EXTEND_KERNEL)
    prefix_page_ids: torch.Tensor | None = None  # int64 [n]: pages to restore for FlashInfer's paged prefill


def step_kernel_config(fmt: PageFormat, device: torch.device) -> Any:
    """The decode kernel's shape for every step: $ZIPKV_DECODE_KERNEL when set, else None where the Hopper
    kernel runs (the plan then takes its own measured shape, HOPPER_CONFIG), else the portable kernel's
    tuned shape for the head_dim (whose tile and stages would not suit the Hopper kernel)."""
    import os

    from zipkv.kernels.attention.decode_config import KERNEL_CONFIG_ENV, decode_impl, kernel_config

    if decode_impl(None, fmt, device) == "hopper" and not os.environ.get(KERNEL_CONFIG_ENV):
        return None
    return kernel_config(fmt.head_dim)


class ZipkvAttention:
    """Per-step metadata and the two forward paths; SGLang's backend object delegates here."""

    def __init__(
        self,
        kv: ZipkvKV,
        allocator: ZipkvAllocator,
        req_to_token: torch.Tensor,  # int32 [R + 1, max_context] (SGLang's ReqToTokenPool.req_to_token)
        num_q_heads: int,
        compressed: bool,
        extend_kernel: Callable[..., Any],  # SGLang's extend_attention_fwd
    ) -> None:
        self.kv, self.allocator, self.req_to_token = kv, allocator, req_to_token
        self.num_q_heads, self.compressed, self.extend_kernel = num_q_heads, compressed, extend_kernel
        self.max_pages_per_req = -(-req_to_token.shape[1] // PAGE_TOKENS)
        from zipkv.kernels.attention.decode_config import (
            hopper_even_shares,
            hopper_lazy_rescale,
            hopper_lean,
            hopper_producer_for_serving,
            hopper_split_cap,
            hopper_warp_softmax,
        )
        from zipkv.kernels.attention.decode_plan import split_plan_impl
        from zipkv.kernels.attention.extend import extend_kernel_choice

        # the kernels' choices for every step, read at start-up: malformed $ZIPKV_DECODE_KERNEL,
        # $ZIPKV_EXTEND_KERNEL, $ZIPKV_SPLIT_PLAN or $ZIPKV_HOPPER_* values fail here
        split_plan_impl()
        hopper_warp_softmax()
        hopper_lazy_rescale()
        hopper_lean()
        hopper_split_cap()
        hopper_even_shares()
        hopper_producer_for_serving()
        self.kernel_config = step_kernel_config(kv.fmt, req_to_token.device)
        self.fused_extend = extend_kernel_choice() == "fused"
        self.flashinfer = flashinfer_prefill_for(num_q_heads, kv.fmt, req_to_token.device)
        self.plan: Any = None
        self.extend_meta: _Extend | None = None
        self._graph: dict[str, torch.Tensor] = {}

    # ---- per-step metadata --------------------------------------------------------------------------
    def begin_step(self, view: BatchView, capturing: bool = False) -> None:
        if not capturing:
            self.allocator.compress_step()
        if view.is_idle:
            return
        if view.is_decode:
            if view.seq_lens_cpu is None:
                raise RuntimeError("zipkv decode needs seq_lens_cpu (keep needs_cpu_seq_lens=True)")
            max_pages = max(-(-max(view.seq_lens_cpu) // PAGE_TOKENS), 1)
            self.plan = self._plan(
                view, page_table(self.req_to_token, view.req_pool_indices, max_pages), max_pages
            )
        else:
            self.extend_meta = self._extend_meta(view)

    def _plan(self, view: BatchView, table: torch.Tensor, max_pages: int) -> Any:
        from zipkv.kernels.attention.decode_plan import plan_decode

        bs = view.batch_size
        indptr = torch.arange(bs + 1, dtype=torch.int32, device=table.device) * max_pages
        kv_lens = view.seq_lens[:bs].to(torch.int32)
        return plan_decode(
            table.reshape(-1), indptr, kv_lens, self.kv.fmt, self.num_q_heads, config=self.kernel_config
        )

    def _extend_meta(self, view: BatchView) -> _Extend:
        if view.extend_seq_lens_cpu is None or view.extend_prefix_lens_cpu is None:
            raise RuntimeError(
                "zipkv extend needs extend_seq_lens_cpu and extend_prefix_lens_cpu (not set in SGLang's "
                "prefill CUDA-graph capture: start SGLang with disable_prefill_cuda_graph=True)"
            )
        device = view.req_pool_indices.device
        ext, pre = view.extend_seq_lens_cpu, view.extend_prefix_lens_cpu
        qo = to_device([0, *torch.tensor(ext).cumsum(0).tolist()], device).to(torch.int32)
        max_ext = max(ext) if ext else 0
        if not any(pre):
            if self.flashinfer is not None:
                self.flashinfer.plan(qo)
            return _Extend(qo, max_ext, None)
        page_ids, pages = self._prefix_pages(view, pre)
        if self.flashinfer is not None and not self.fused_extend:
            self.flashinfer.plan(qo, PrefixPages(pages, pre))
            return _Extend(qo, max_ext, None, prefix_page_ids=page_ids)
        if self.fused_extend:  # the kernel reads the prefix pages itself: no scratch indices
            from zipkv.kernels.attention.extend import plan_extend

            return _Extend(
                qo, max_ext, None, plan_extend(ext, pre, page_ids, pages, self.kv.fmt, self.num_q_heads)
            )
        return _Extend(qo, max_ext, self._scratch_prefix(page_ids, pages, pre))

    def _prefix_pages(self, view: BatchView, prefix_lens: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Every request's prefix pages, request by request (int64 [n] on the device), and their counts."""
        pages = [-(-p // PAGE_TOKENS) for p in prefix_lens]
        table = page_table(self.req_to_token, view.req_pool_indices, max(max(pages), 1))
        width = table.shape[1]
        keep = to_device([b * width + j for b, n in enumerate(pages) for j in range(n)], table.device)
        return table.reshape(-1)[keep].to(torch.int64), pages

    @staticmethod
    def _scratch_prefix(page_ids: torch.Tensor, pages: list[int], prefix_lens: list[int]) -> _Prefix:
        """Where each prefix token lands once the pages are restored into scratch, for SGLang's kernel."""
        device = page_ids.device
        starts = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()[:-1]]) * PAGE_TOKENS
        rows = torch.cat([s + torch.arange(p) for s, p in zip(starts.tolist(), prefix_lens, strict=True)])
        indptr = to_device([0, *torch.tensor(prefix_lens).cumsum(0).tolist()], device).to(torch.int32)
        return _Prefix(page_ids, indptr, to_device(rows.tolist(), device))

    # ---- CUDA graphs (decode) -----------------------------------------------------------------------
    def init_graph_state(self, max_bs: int, device: torch.device) -> None:
        self._graph["table"] = torch.zeros(max_bs, self.max_pages_per_req, dtype=torch.int32, device=device)

    def graph_fill_table(self, view: BatchView) -> None:
        """Before capture and before every replay (outside the graph): the page table of the batch, read
        from req_to_token here because SGLang lets the scheduler rewrite req_to_token once replay starts."""
        bs, table = view.batch_size, self._graph["table"]
        table[:bs].copy_(page_table(self.req_to_token, view.req_pool_indices[:bs], self.max_pages_per_req))

    def graph_plan(self, view: BatchView) -> None:
        """Recorded into the decode graph: the plan from the static table and SGLang's static seq_lens."""
        bs = view.batch_size
        self.plan = self._plan(view, self._graph["table"][:bs], self.max_pages_per_req)

    # ---- forward ------------------------------------------------------------------------------------
    def decode(
        self, q: torch.Tensor, layer_id: int, sm_scale: float, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q: bf16 [B, Hq * D] (or [B, Hq, D]); returns [B, Hq * D]."""
        from zipkv.kernels.attention.decode import decode_attention

        fmt, pages = self.kv.fmt, self.kv.pages(layer_id)
        q3 = q.reshape(-1, self.num_q_heads, fmt.head_dim)
        o3 = None if out is None else out.view(-1, self.num_q_heads, fmt.head_dim)
        res = decode_attention(
            self.plan,
            q3,
            pages.heap,
            pages.loc,
            pages.meta,
            sm_scale,
            compressed=self.compressed,
            out=o3,
        )
        return res.reshape(q3.shape[0], -1)

    def extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, sm_scale: float
    ) -> torch.Tensor:
        """Causal attention of the new tokens over their prefix and themselves; q: [N, Hq * D]."""
        meta = self.extend_meta
        if meta is None:
            raise RuntimeError("zipkv extend called before begin_step")
        fmt = self.kv.fmt
        q3 = q.reshape(-1, self.num_q_heads, fmt.head_dim)
        k3, v3 = k.reshape(-1, fmt.num_kv_heads, fmt.head_dim), v.reshape(-1, fmt.num_kv_heads, fmt.head_dim)
        if meta.fused is not None:
            return self._extend_fused(meta.fused, q3, k3, v3, layer_id, sm_scale)
        if self.flashinfer is not None:
            ids = meta.prefix_page_ids
            restored = None if ids is None else self.kv.read_pages(layer_id, ids)
            return self.flashinfer.run(q3, k3, v3, sm_scale, restored).reshape(q3.shape[0], -1)
        o3 = torch.empty_like(q3)
        if meta.prefix is None:
            k_buf, v_buf = k3.contiguous(), v3.contiguous()  # never read: no request has a prefix
            bs = meta.qo_indptr.numel() - 1
            kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=q.device)
            kv_indices = torch.zeros(1, dtype=torch.int64, device=q.device)
        else:
            pages = self.kv.read_pages(layer_id, meta.prefix.page_ids)  # [n, 2, H, 16, D]
            k_buf = pages[:, 0].permute(0, 2, 1, 3).reshape(-1, fmt.num_kv_heads, fmt.head_dim)
            v_buf = pages[:, 1].permute(0, 2, 1, 3).reshape(-1, fmt.num_kv_heads, fmt.head_dim)
            kv_indptr, kv_indices = meta.prefix.kv_indptr, meta.prefix.kv_indices
        self.extend_kernel(
            q3,
            k3.contiguous(),
            v3.contiguous(),
            o3,
            k_buf,
            v_buf,
            meta.qo_indptr,
            kv_indptr,
            kv_indices,
            None,
            True,
            None,
            meta.max_extend_tokens,
            1.0,
            1.0,
            sm_scale,
        )
        return o3.reshape(q3.shape[0], -1)

    def _extend_fused(
        self, plan: ExtendPlan, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, layer: int, scale: float
    ) -> torch.Tensor:
        """The new tokens over their prefix pages, read compressed in the kernel (no scratch copy)."""
        from zipkv.kernels.attention.extend import extend_attention

        pages = self.kv.pages(layer)
        out = extend_attention(
            plan, q3, k3.contiguous(), v3.contiguous(), pages.heap, pages.loc, pages.meta,
            scale, compressed=self.compressed,
        )  # fmt: skip
        return out.reshape(q3.shape[0], -1)

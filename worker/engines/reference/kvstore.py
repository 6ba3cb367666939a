"""The reference engine's KV store: zipkv's page pool plus the codec's page reader and writer.

This is the one place where the engine meets the allocator (`zipkv.allocator.PagePool`: the heap, page
tables, compression of full pages, admission arithmetic) and the kernels (`store_tokens`,
`gather_pages`, fused decode attention). On the CPU it uses the torch reference paths; on CUDA the
Triton kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.encode_timer import TimedEncoder
from zipkv.worker.engine_stats import KernelsInUse, KVStats, decode_kernel_label, kv_stats_of


class KVStore:
    def __init__(
        self,
        fmt: PageFormat,
        num_layers: int,
        budget_bytes: int,
        device: str,
        compression: bool,
        chunk_bytes: int = 256 << 10,
        kernels: str = "auto",
    ) -> None:
        """``kernels``: "auto" (Triton on CUDA, the torch reference elsewhere), "triton" (also on the CPU
        under TRITON_INTERPRET=1, to test the GPU code path), or "torch"."""
        if kernels not in ("auto", "triton", "torch"):
            raise ValueError(f"kernels must be auto, triton or torch, got {kernels!r}")
        from zipkv.allocator import PagePool
        from zipkv.allocator.device import default_encoder

        self.fmt = fmt
        self.num_layers = num_layers
        self.device = torch.device(device)
        self.compression = compression
        self.encoder = TimedEncoder(default_encoder(self.device), self.device)
        self.pool = PagePool(
            fmt,
            num_layers,
            budget_bytes,
            # Chunks hold whole raw pages.
            chunk_bytes=fmt.raw_page_bytes * max(1, chunk_bytes // fmt.raw_page_bytes),
            device=device,
            shared_pool=True,
            compression=compression,
            encoder=self.encoder,
        )
        use_triton = kernels == "triton" or (kernels == "auto" and self.device.type == "cuda")
        if use_triton:
            from zipkv.kernels.attention import decode as decode_attention
            from zipkv.kernels.codec import pages as codec

            self._store_tokens: Any = codec.store_tokens
            self._decode_mod: Any = decode_attention
        else:
            from zipkv.kernels.reference import pages as reference

            self._store_tokens = reference.store_tokens
            self._decode_mod = None
        from zipkv.kernels.reference import pages as ref

        self._gather_pages: Any = ref.gather_pages
        self.kernels = KernelsInUse(
            decode=decode_kernel_label(compression) if use_triton else "torch_reference",
            encode="triton" if self.device.type == "cuda" else "torch_reference",
            page_format=f"v{fmt.version}",
        )

    # ---- sizes --------------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """Uncompressed KV bytes per token over all layers."""
        return self.fmt.raw_page_bytes * self.num_layers // PAGE_TOKENS

    @property
    def decode_on_device(self) -> bool:
        return self._decode_mod is not None

    # ---- the allocator ------------------------------------------------------------------------------
    def allocate(self, n_pages: int, request_id: str) -> list[int]:
        """New pages for ``request_id``, drawn from its reservation."""
        return [int(p) for p in self.pool.allocate(n_pages, request_id=request_id)] if n_pages else []

    def free(self, page_ids: list[int]) -> None:
        if page_ids:
            self.pool.free(page_ids)

    def mark_full(self, page_ids: list[int]) -> None:
        if page_ids:
            self.pool.mark_full(page_ids)

    def end_step(self) -> None:
        self.pool.end_step()

    def reserve(self, request_id: str, max_new_pages: int) -> None:
        self.pool.reserve(request_id, max_new_pages)

    def release(self, request_id: str) -> None:
        self.pool.release(request_id)

    def headroom_pages(self) -> int:
        return int(self.pool.headroom_pages())

    def stats(self) -> Any:
        return self.pool.stats()

    def kv_stats(self) -> KVStats:
        """The pool's state and the encoder's counts (host counters; no device wait)."""
        return kv_stats_of(
            self.pool.stats(), self.fmt.raw_page_bytes, self.num_layers, self.encoder.poll(), self.kernels
        )

    # ---- the codec ----------------------------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens (``k``, ``v``: bf16 ``[n, Hkv, D]``) into their raw pages."""
        pages = self.pool.layer(layer)
        self._store_tokens(pages.heap, pages.loc, slots, k, v, self.fmt)

    def read_pages(self, layer: int, page_ids: torch.Tensor) -> torch.Tensor:
        """bf16 ``[n, 2, Hkv, 16, D]``: the pages restored, raw or compressed."""
        pages = self.pool.layer(layer)
        return self._gather_pages(pages.heap, pages.loc, pages.meta, page_ids, self.fmt)

    def plan_decode(self, page_ids: list[list[int]], kv_lens: list[int], num_q_heads: int) -> Any:
        """A decode plan for one step of single-token decodes (CUDA only), reused by every layer."""
        flat = [p for pages in page_ids for p in pages]
        indptr = [0]
        for pages in page_ids:
            indptr.append(indptr[-1] + len(pages))
        dev = self.device
        return self._decode_mod.plan_decode(
            torch.tensor(flat, dtype=torch.int32, device=dev),
            torch.tensor(indptr, dtype=torch.int32, device=dev),
            torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            self.fmt,
            num_q_heads,
        )

    def decode_attention(self, layer: int, plan: Any, q: torch.Tensor, sm_scale: float) -> torch.Tensor:
        pages = self.pool.layer(layer)
        return self._decode_mod.decode_attention(
            plan, q, pages.heap, pages.loc, pages.meta, sm_scale, compressed=self.compression
        )


def idle_capacity_tokens(
    fmt: PageFormat, num_layers: int, budget_bytes: int, compression: bool, chunk_bytes: int = 256 << 10
) -> int:
    """New tokens an idle store of this budget admits: the allocator's own arithmetic, on the meta device
    (no memory is taken), so a start-up check can ask before any weights load."""
    try:
        store = KVStore(fmt, num_layers, budget_bytes, "meta", compression, chunk_bytes, "torch")
    except ValueError:  # fewer chunks than layers
        return 0
    return store.headroom_pages() * PAGE_TOKENS

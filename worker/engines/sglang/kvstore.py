"""The KV store zipkv's attention reads and writes inside SGLang: the pool's pages per SGLang layer id, new
tokens stored into their raw pages, pages restored to bf16 (no sglang import; CPU-tested).

Split from attention.py: storing and restoring pages is the pool's side (kv_pool.py stores through it too);
attention.py plans each step and runs the kernels over these pages.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zipkv.allocator import PagePool
from zipkv.allocator.pool import LayerPages
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat


class ZipkvKV:
    """The pool's page tables and the token store, per SGLang layer id."""

    def __init__(self, pool: PagePool, fmt: PageFormat, start_layer: int) -> None:
        self.pool, self.fmt, self.start_layer = pool, fmt, start_layer
        try:  # the Triton codec on the GPU; the torch reference elsewhere
            from zipkv.kernels.codec import pages as codec

            self._store = codec.store_tokens
            self._as_rows: Callable[[torch.Tensor], torch.Tensor] = codec.as_token_rows
            self._decode_pages: Callable[..., None] | None = codec.decode_pages
        except ImportError:
            from zipkv.kernels.reference import pages as reference

            self._store = reference.store_tokens
            self._as_rows = _as_is  # the reference indexes any layout
            self._decode_pages = None

    def pages(self, layer_id: int) -> LayerPages:
        """SGLang's layer ``layer_id`` in the pool (a pipeline stage's layers start at ``start_layer``)."""
        return self.pool.layer(layer_id - self.start_layer)

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [n, H, D] in the model dtype (bf16); slots: int64 [n]."""
        if k.dtype != torch.bfloat16:
            raise TypeError(
                f"zipkv stores bf16 KV; this model runs {k.dtype}: start SGLang with dtype=bfloat16"
            )
        pages = self.pages(layer_id)
        # the QKV projection's slices as they are: the store reads tokens any stride apart
        self._store(pages.heap, pages.loc, slots, self._as_rows(k), self._as_rows(v), self.fmt)

    def read_pages(self, layer_id: int, page_ids: torch.Tensor) -> torch.Tensor:
        """Pages of one layer, raw or compressed, restored: bf16 [n, 2, H, 16, D]."""
        pages = self.pages(layer_id)
        if self._decode_pages is None or page_ids.device.type != "cuda":
            from zipkv.kernels.reference.pages import gather_pages

            return gather_pages(pages.heap, pages.loc, pages.meta, page_ids, self.fmt)
        fmt = self.fmt
        out = torch.empty(
            page_ids.numel(),
            2,
            fmt.num_kv_heads,
            PAGE_TOKENS,
            fmt.head_dim,
            dtype=torch.bfloat16,
            device=page_ids.device,
        )
        with self.pool.device_timers["restore"].span():
            self._decode_pages(pages.heap, pages.loc[page_ids], pages.meta[page_ids], out, fmt)
        return out


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x

"""zipkv's KV pool and token allocator as SGLang sees them: subclasses of SGLang's ``KVCache`` and
``BaseTokenToKVPoolAllocator`` over a ``PagePool`` heap.

Imports SGLang at module level: only seams.py imports this module, on demand, once SGLang is known to be
importable (the rest of the package stays importable without SGLang).
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.kernels.ops.memory.allocator import alloc_extend_kernel
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import KVCache, unwrap_write_loc

from zipkv.allocator import PagePool
from zipkv.allocator.device import default_encoder
from zipkv.kernels.attention.decode_config import serving_format_version
from zipkv.kernels.format.layout import PageFormat
from zipkv.worker.encode_timer import TimedEncoder
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.kvstore import ZipkvKV
from zipkv.worker.engines.sglang.slots import budget_bytes_for_tokens, virtual_pages_for_budget


class ZipkvKVCache(KVCache):
    """SGLang's KV pool over a PagePool heap; ``size`` counts virtual slots."""

    def __init__(
        self,
        *,
        raw_tokens: int,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str,
        start_layer: int | None,
        end_layer: int | None,
        compression: bool,
    ) -> None:
        # v3 on sm_90, where the Hopper decode kernel reads it (kernels/attention/decode_plan.py)
        version = serving_format_version(torch.device(device))
        self.fmt = PageFormat(head_dim=head_dim, num_kv_heads=head_num, version=version)
        self.budget_bytes = budget_bytes_for_tokens(raw_tokens, self.fmt, layer_num)
        max_pages = virtual_pages_for_budget(self.budget_bytes, self.fmt, layer_num, compression)
        super().__init__(
            (max_pages - 1) * 16,
            16,
            torch.bfloat16,
            layer_num,
            device,
            False,
            start_layer,
            end_layer,
            "zipkv",
        )
        self.compression = compression
        self.pool = PagePool(
            self.fmt,
            layer_num,
            self.budget_bytes,
            device=device,
            compression=compression,
            max_pages=max_pages,
            encoder=TimedEncoder(default_encoder(torch.device(device)), device),  # for /metrics
        )
        self.kv = ZipkvKV(self.pool, self.fmt, self.start_layer)
        self._finalize_allocation_log(self.size)

    def get_kv_size_bytes(self) -> int:
        return self.budget_bytes

    def set_kv_buffer(
        self,
        layer: Any,
        loc_info: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: Any = None,
        v_scale: Any = None,
        **kwargs: Any,
    ) -> None:
        if k_scale is not None or v_scale is not None:
            raise ValueError("zipkv stores bf16 KV losslessly; KV scales (fp8 KV) are not supported")
        loc, _, _ = unwrap_write_loc(loc_info)
        self.kv.store(layer.layer_id, loc, cache_k, cache_v)

    def _no_dense(self, *_: Any, **__: Any) -> torch.Tensor:
        raise NotImplementedError(
            "the zipkv pool has no dense per-layer K/V tensors; only the zipkv attention backends can read it"
        )

    get_key_buffer = get_value_buffer = get_kv_buffer = _no_dense


class ZipkvTokenAllocator(ZipkvAllocator, BaseTokenToKVPoolAllocator):
    def __init__(self, kvcache: ZipkvKVCache) -> None:
        BaseTokenToKVPoolAllocator.__init__(
            self, kvcache.size, 16, torch.bfloat16, kvcache.device, kvcache, False
        )
        ZipkvAllocator.__init__(self, kvcache.pool, kvcache.device, kvcache.compression)
        self.extend_kernel = self._sglang_extend

    @staticmethod
    def _sglang_extend(prefix_lens: Any, seq_lens: Any, last_loc: Any, pages: Any, out: Any) -> None:
        bs = len(prefix_lens)
        if pages.numel() == 0:  # no new page (the kernel still takes a valid pointer)
            pages = torch.zeros(1, dtype=torch.int64, device=out.device)
        alloc_extend_kernel[(bs,)](
            prefix_lens, seq_lens, last_loc, pages, out, 1 << max(bs - 1, 0).bit_length(), 16
        )

    def resize(self, config: Any) -> None:
        raise NotImplementedError("zipkv's pool is sized once; unset SGLANG_ENABLE_POST_CAPTURE_KV_SIZING")

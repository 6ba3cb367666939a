"""The one module that touches SGLang internals (pinned to sglang 0.5.17; map: docs/sglang.md).

Every ``import sglang...`` and every patch of an SGLang class lives here. `SEAMS` (sglang_seam_table.py,
re-exported here) records, as data, the signature of each SGLang function or method this module relies on;
tests/worker/test_sglang_seams.py checks them against the real SGLang source, so an upgrade that moves a
seam fails a test instead of a GPU run.

`install()` (called by `zipkv.worker.sglang_plugin.register` in every SGLang process, the scheduler included):
1. registers the attention backends ``zipkv`` and ``zipkv_uncompressed`` (the uncompressed twin: same pool,
   same kernel source, no page ever compressed) and adds them to the CLI choices;
2. makes ``KVCacheConfigurator._build_mha_kv_pool`` / ``_build_token_to_kv_pool_allocator`` return zipkv's
   pool and allocator when a zipkv backend is selected (the byte budget is what SGLang's memory profile gave
   the uncompressed pool: ``max_total_num_tokens x cell size``);
3. makes the idle memory check count zipkv's pool in its own units (page ids held vs. the prefix cache and
   requests, and the PagePool's byte accounting) instead of SGLang's ``available + cached == total``.
Nothing changes for other backends.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch

from .kv_stats_board import KVStatsBoard
from .sglang_admission import AdmissionLatch
from .sglang_reclaim import PrefixCache
from .sglang_seam_table import SEAMS as SEAMS
from .sglang_seam_table import Seam as Seam
from .sglang_version import SGLANG_VERSION as SGLANG_VERSION
from .sglang_version import check_sglang_version

log = logging.getLogger("zipkv.worker.sglang")

BACKEND_NAMES = {"zipkv": True, "zipkv_uncompressed": False}  # name -> compression


def is_zipkv(backend: str | None) -> bool:
    return backend in BACKEND_NAMES


def _zipkv_backend(server_args: Any) -> str | None:
    """The zipkv backend name if one is selected, after checking that prefill and decode agree."""
    prefill, decode = server_args.get_attention_backends()
    if not (is_zipkv(prefill) or is_zipkv(decode)):
        return None
    if prefill != decode:
        raise ValueError(
            f"zipkv serves prefill and decode over one compressed pool: set attention_backend="
            f"{decode if is_zipkv(decode) else prefill!r} for both (got {prefill!r}, {decode!r})"
        )
    if server_args.page_size != 16:
        raise ValueError(
            f"zipkv pages hold 16 tokens: start SGLang with page_size=16 (got {server_args.page_size})"
        )
    if server_args.tp_size != 1:
        raise ValueError(f"zipkv on SGLang runs with tp_size=1 in this version (got {server_args.tp_size})")
    if server_args.kv_cache_dtype not in (None, "auto", "bfloat16", "bf16"):
        raise ValueError(f"zipkv stores bf16 KV: drop kv_cache_dtype={server_args.kv_cache_dtype!r}")
    return str(prefill)


# ---- the classes SGLang sees ------------------------------------------------------------------------


def _classes() -> dict[str, type]:
    """Build (once) the SGLang subclasses; they need sglang importable, so they are made on demand."""
    if _CLASSES:
        return _CLASSES
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.memory.allocator import alloc_extend_kernel
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import KVCache, unwrap_write_loc

    from zipkv.allocator import PagePool
    from zipkv.allocator.device import default_encoder
    from zipkv.kernels.layout import PageFormat

    from .encode_timer import TimedEncoder
    from .sglang_backend import BatchView, ZipkvAttention, ZipkvKV
    from .sglang_pool import ZipkvAllocator
    from .sglang_slots import budget_bytes_for_tokens, virtual_pages_for_budget

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
            self.fmt = PageFormat(head_dim=head_dim, num_kv_heads=head_num)
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
                "the zipkv pool has no dense per-layer K/V tensors; only the zipkv "
                "attention backends can read it"
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
            raise NotImplementedError(
                "zipkv's pool is sized once; unset SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"
            )

    def view_of(fb: Any) -> BatchView:
        cpu, mode = fb.seq_lens_cpu, fb.forward_mode
        return BatchView(
            mode.is_decode(),
            mode.is_idle(),
            fb.batch_size,
            fb.req_pool_indices,
            fb.seq_lens,
            None if cpu is None else cpu.tolist(),
            # The decode CUDA graph's replay view (a SimpleNamespace, build_replay_fb_view) has no
            # extend fields: decode never reads them.
            getattr(fb, "extend_prefix_lens_cpu", None),
            getattr(fb, "extend_seq_lens_cpu", None),
        )

    class ZipkvAttnBackend(AttentionBackend):
        def __init__(self, runner: Any, compressed: bool) -> None:
            pool = runner.token_to_kv_pool
            if not isinstance(pool, ZipkvKVCache):
                raise RuntimeError(
                    "the zipkv attention backend needs the zipkv KV pool; was the zipkv plugin "
                    "loaded in the scheduler process? (pip install zipkv; SGLANG_PLUGINS)"
                )
            if runner.use_mla_backend or runner.model_config.is_encoder_decoder or runner.sliding_window_size:
                raise NotImplementedError("zipkv serves decoder-only MHA/GQA models without sliding windows")
            self.token_to_kv_pool = pool
            self.req_to_token_pool = runner.req_to_token_pool
            self.forward_metadata = None
            heads = runner.model_config.num_attention_heads
            self.impl = ZipkvAttention(
                pool.kv,
                runner.token_to_kv_pool_allocator,
                runner.req_to_token_pool.req_to_token,
                heads,
                compressed,
                extend_attention_fwd,
            )

        def init_forward_metadata(self, forward_batch: Any) -> None:
            self.impl.begin_step(view_of(forward_batch), torch.cuda.is_current_stream_capturing())

        def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
            if not in_capture:
                self.impl.allocator.compress_step()
            self.impl.graph_fill_table(view_of(forward_batch))

        def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
            self.impl.graph_plan(view_of(forward_batch))

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            self.impl.init_graph_state(max_bs, self.token_to_kv_pool.pool.heap.device)

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return 1

        def _check(self, layer: Any) -> None:
            if layer.logit_cap or getattr(layer, "k_scale", None) is not None:
                raise NotImplementedError("zipkv attention has no logit cap or KV scales")

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # type: ignore[no-untyped-def]
            self._check(layer)
            if save_kv_cache and k is not None:
                self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
            return self.impl.decode(q, layer.layer_id, layer.scaling)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # type: ignore[no-untyped-def]
            self._check(layer)
            if save_kv_cache:
                self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
            return self.impl.extend(q, k, v, layer.layer_id, layer.scaling)

    _CLASSES.update(kv_cache=ZipkvKVCache, allocator=ZipkvTokenAllocator, backend=ZipkvAttnBackend)
    return _CLASSES


_CLASSES: dict[str, type] = {}
_INSTALLED: list[bool] = []


# ---- install ----------------------------------------------------------------------------------------


def install() -> None:
    """Register the backends and patch the pool, allocator and idle-check seams (idempotent)."""
    if _INSTALLED:
        return
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    for name, compressed in BACKEND_NAMES.items():
        register_attention_backend(name)(lambda runner, c=compressed: _classes()["backend"](runner, c))
    add_attention_backend_choices([n for n in BACKEND_NAMES if n not in ATTENTION_BACKEND_CHOICES])

    build_pool = KVCacheConfigurator._build_mha_kv_pool
    build_allocator = KVCacheConfigurator._build_token_to_kv_pool_allocator
    check_full_pool = SchedulerInvariantChecker._check_full_pool
    get_new_batch_prefill = Scheduler.get_new_batch_prefill

    def _build_mha_kv_pool(
        self: Any, *, max_total_num_tokens: int, mha_pool_class: type, quant_method: Any = None
    ):  # type: ignore[no-untyped-def]
        name = _zipkv_backend(self.server_args)
        if name is None:
            return build_pool(
                self,
                max_total_num_tokens=max_total_num_tokens,
                mha_pool_class=mha_pool_class,
                quant_method=quant_method,
            )
        info = self.layer_info
        pool = _classes()["kv_cache"](
            raw_tokens=max_total_num_tokens,
            head_num=self.model_config.get_num_kv_heads(1),
            head_dim=self.model_config.head_dim,
            layer_num=info.num_effective_layers,
            device=self.device,
            start_layer=info.start_layer,
            end_layer=info.end_layer,
            compression=BACKEND_NAMES[name],
        )
        log.info(
            "zipkv pool: %s, budget %d bytes for %d raw tokens, %d virtual slots",
            name,
            pool.budget_bytes,
            max_total_num_tokens,
            pool.size,
        )
        return pool

    def _build_token_to_kv_pool_allocator(self: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        pool = kwargs["token_to_kv_pool"]
        if _CLASSES and isinstance(pool, _CLASSES["kv_cache"]):  # built by _build_mha_kv_pool above
            allocator: Any = _CLASSES["allocator"](pool)
            board = KVStatsBoard.from_env()  # the replica's /metrics reads it (kv_stats_board.py)
            if board is not None:
                allocator.stats_board = board
                board.publish_pool(allocator.pool)
            return allocator
        return build_allocator(self, **kwargs)

    def _check_full_pool(self: Any, ps: Any, uncached: int = 0):  # type: ignore[no-untyped-def]
        allocator = self.token_to_kv_pool_allocator
        if not (_CLASSES and isinstance(allocator, _CLASSES["allocator"])):
            return check_full_pool(self, ps, uncached)
        return cast(Any, allocator).idle_check(
            self.tree_cache.evictable_size(),
            self.tree_cache.protected_size(),
            self.pool_stats_observer.session_held_tokens(),
            uncached,
        )

    def _get_new_batch_prefill(self: Any, running_batch: Any):  # type: ignore[no-untyped-def]
        # SGLang's batch_is_full latch only clears when a request finishes; compression frees room
        # earlier (sglang_admission.py).
        allocator = self.token_to_kv_pool_allocator
        if _CLASSES and isinstance(allocator, _CLASSES["allocator"]):
            latch = self.__dict__.setdefault("_zipkv_admission_latch", AdmissionLatch())
            latch.release(running_batch, allocator)
            # with the radix cache on, the allocator reclaims from it (sglang_reclaim.py)
            ours = cast(Any, allocator)
            if ours.prefix_cache is None and not self.tree_cache.is_chunk_cache():
                ours.prefix_cache = _prefix_cache(self.tree_cache)
        return get_new_batch_prefill(self, running_batch)

    KVCacheConfigurator._build_mha_kv_pool = _build_mha_kv_pool
    Scheduler.get_new_batch_prefill = _get_new_batch_prefill
    KVCacheConfigurator._build_token_to_kv_pool_allocator = _build_token_to_kv_pool_allocator
    SchedulerInvariantChecker._check_full_pool = _check_full_pool
    _INSTALLED.append(True)
    log.info("zipkv installed into sglang %s: backends %s", SGLANG_VERSION, ", ".join(BACKEND_NAMES))


# ---- the parent-process surface the engine adapter uses (sglang.Engine) -------------------------------


def event_loop(engine: Any) -> Any:
    """The asyncio loop ``sglang.Engine`` runs its tokenizer manager on."""
    return engine.loop


def abort_request(engine: Any, request_id: str) -> None:
    engine.tokenizer_manager.abort_request(rid=request_id)


async def load_snapshot(engine: Any) -> Any:
    """The scheduler's latest LoadSnapshot (its counts read the allocator's available_size live)."""
    snaps = await engine.tokenizer_manager.get_loads(include=["all"])
    return snaps[0] if snaps else None


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """SGLang's scheduler entry with zipkv installed first (for `engine_class`, without the entry point)."""
    from sglang.srt.managers.scheduler import run_scheduler_process as run

    check_sglang_version()
    install()
    return run(*args, **kwargs)


def engine_class() -> type:
    """``sglang.Engine`` whose scheduler process installs zipkv even when the plugin is not installed."""
    from sglang.srt.entrypoints.engine import Engine

    check_sglang_version()
    install()
    return type(
        "ZipkvSGLangEngine", (Engine,), {"run_scheduler_process_func": staticmethod(run_scheduler_process)}
    )


def _prefix_cache(tree_cache: Any) -> PrefixCache:
    """SGLang's radix cache as zipkv's allocator reclaims from it (sglang_reclaim.py)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    def evict_tokens(n: int) -> int:
        return int(tree_cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted)

    return PrefixCache(lambda: int(tree_cache.evictable_size()), evict_tokens)

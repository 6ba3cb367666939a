"""The one module that touches SGLang internals (pinned to sglang 0.5.17; map: docs/sglang.md).

Every patch of an SGLang class lives here, and every ``import sglang...`` but those of the two modules that
subclass SGLang's classes at module level (kv_pool.py, backend.py), which only this module imports, on
demand. `SEAMS` (seam_table.py,
re-exported here) records, as data, the signature of each SGLang function or method this module relies on;
tests/worker/test_sglang_seams.py checks them against the real SGLang source, so an upgrade that moves a
seam fails a test instead of a GPU run.

`install()` (called by `plugin.register` in every SGLang process, the scheduler included):
1. registers the attention backends ``zipkv`` and ``zipkv_uncompressed`` (the uncompressed twin: same pool,
   same kernel source, no page ever compressed) and adds them to the CLI choices;
2. makes ``KVCacheConfigurator._build_mha_kv_pool`` / ``_build_token_to_kv_pool_allocator`` return zipkv's
   pool and allocator when a zipkv backend is selected (the byte budget is what SGLang's memory profile gave
   the uncompressed pool: ``max_total_num_tokens x cell size``);
3. makes the idle memory check count zipkv's pool in its own units (page ids held vs. the prefix cache and
   requests, and the PagePool's byte accounting) instead of SGLang's ``available + cached == total``.
4. before each prefill decision, releases SGLang's ``batch_is_full`` latch when compression freed room
   (admission_latch.py) and hands the allocator the radix cache to reclaim from (reclaim.py);
5. when SGLang's decode check finds no room, lets the allocator take in late room before SGLang retracts
   (reclaim.decode_room);
6. under tensor parallelism, at the start of each scheduler pass, has the ranks agree on the headroom
   they all answer with (rank_agreement.py), over the scheduler's CPU group.
Nothing changes for other backends.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from zipkv.worker.engines.sglang.admission_latch import AdmissionLatch
from zipkv.worker.engines.sglang.backend_choice import BACKEND_NAMES, zipkv_backend
from zipkv.worker.engines.sglang.idle_check import idle_check
from zipkv.worker.engines.sglang.kv_stats_board import KVStatsBoard
from zipkv.worker.engines.sglang.rank_agreement import gloo_reduce_min
from zipkv.worker.engines.sglang.reclaim import PrefixCache
from zipkv.worker.engines.sglang.seam_table import SEAMS as SEAMS
from zipkv.worker.engines.sglang.seam_table import Seam as Seam
from zipkv.worker.engines.sglang.version import SGLANG_VERSION as SGLANG_VERSION
from zipkv.worker.engines.sglang.version import check_sglang_version

log = logging.getLogger("zipkv.worker.sglang")

# ---- the classes SGLang sees ------------------------------------------------------------------------


def _classes() -> dict[str, type]:
    """The SGLang subclasses (kv_pool.py, backend.py), imported on demand: they need sglang importable."""
    if not _CLASSES:
        from zipkv.worker.engines.sglang.backend import ZipkvAttnBackend
        from zipkv.worker.engines.sglang.kv_pool import ZipkvKVCache, ZipkvTokenAllocator

        _CLASSES.update(kv_cache=ZipkvKVCache, allocator=ZipkvTokenAllocator, backend=ZipkvAttnBackend)
    return _CLASSES


_CLASSES: dict[str, type] = {}
_INSTALLED: list[bool] = []


# ---- install ----------------------------------------------------------------------------------------


def install() -> None:
    """Register the backends and patch the pool, allocator and idle-check seams (idempotent)."""
    if _INSTALLED:
        return
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    _register_backends()
    _patch_pool_builders(KVCacheConfigurator)
    _patch_prefill(Scheduler)
    _patch_pass_start(Scheduler)
    _patch_idle_check(SchedulerInvariantChecker)
    _patch_decode_check(ScheduleBatch)
    _INSTALLED.append(True)
    log.info("zipkv installed into sglang %s: backends %s", SGLANG_VERSION, ", ".join(BACKEND_NAMES))


def _register_backends() -> None:
    """Step 1: the backends ``zipkv`` and ``zipkv_uncompressed``, also among the CLI's choices."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    for name, compressed in BACKEND_NAMES.items():
        register_attention_backend(name)(lambda runner, c=compressed: _classes()["backend"](runner, c))
    add_attention_backend_choices([n for n in BACKEND_NAMES if n not in ATTENTION_BACKEND_CHOICES])


def _patch_pool_builders(configurator: Any) -> None:
    """Step 2: SGLang's ``KVCacheConfigurator`` builds zipkv's pool and allocator for a zipkv backend."""
    build_pool = configurator._build_mha_kv_pool
    build_allocator = configurator._build_token_to_kv_pool_allocator

    def _build_mha_kv_pool(
        self: Any, *, max_total_num_tokens: int, mha_pool_class: type, quant_method: Any = None
    ):  # type: ignore[no-untyped-def]
        name = zipkv_backend(self.server_args)
        if name is None:
            return build_pool(
                self,
                max_total_num_tokens=max_total_num_tokens,
                mha_pool_class=mha_pool_class,
                quant_method=quant_method,
            )
        return _zipkv_pool(self, name, max_total_num_tokens)

    def _build_token_to_kv_pool_allocator(self: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        pool = kwargs["token_to_kv_pool"]
        if _CLASSES and isinstance(pool, _CLASSES["kv_cache"]):  # built by _build_mha_kv_pool above
            return _zipkv_allocator(pool, self.server_args.tp_size)
        return build_allocator(self, **kwargs)

    configurator._build_mha_kv_pool = _build_mha_kv_pool
    configurator._build_token_to_kv_pool_allocator = _build_token_to_kv_pool_allocator


def _zipkv_pool(configurator: Any, name: str, max_total_num_tokens: int) -> Any:
    """zipkv's KV pool over the bytes SGLang's memory profile gave the uncompressed pool."""
    info = configurator.layer_info
    pool = _classes()["kv_cache"](
        raw_tokens=max_total_num_tokens,
        # This rank's KV heads (SGLang's own pools divide them the same way).
        head_num=configurator.model_config.get_num_kv_heads(configurator.server_args.tp_size),
        head_dim=configurator.model_config.head_dim,
        layer_num=info.num_effective_layers,
        device=configurator.device,
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


def _zipkv_allocator(pool: Any, tp_size: int) -> Any:
    """zipkv's allocator over ``pool``, agreeing across tensor-parallel ranks, publishing to /metrics."""
    allocator: Any = _CLASSES["allocator"](pool)
    if tp_size > 1:  # the ranks' schedulers must admit alike (allocator.py)
        allocator.agree_across_ranks()
    board = KVStatsBoard.from_env()  # the replica's /metrics reads it (kv_stats_board.py)
    if board is not None:
        allocator.stats_board = board
        board.publish_pool(allocator.pool)
    return allocator


def _patch_idle_check(checker: Any) -> None:
    """Step 3: the idle memory check counts zipkv's pool in its own units."""
    check_full_pool = checker._check_full_pool

    def _check_full_pool(self: Any, ps: Any, uncached: int = 0):  # type: ignore[no-untyped-def]
        allocator = self.token_to_kv_pool_allocator
        if not (_CLASSES and isinstance(allocator, _CLASSES["allocator"])):
            return check_full_pool(self, ps, uncached)
        return idle_check(
            cast(Any, allocator),
            self.tree_cache.evictable_size(),
            self.tree_cache.protected_size(),
            self.pool_stats_observer.session_held_tokens(),
            uncached,
        )

    checker._check_full_pool = _check_full_pool


def _patch_prefill(scheduler: Any) -> None:
    """Step 4, before each prefill decision: release SGLang's batch_is_full latch when compression freed
    room, and wire the radix cache into the allocator for reclaiming."""
    get_new_batch_prefill = scheduler.get_new_batch_prefill

    def _get_new_batch_prefill(self: Any, running_batch: Any):  # type: ignore[no-untyped-def]
        # SGLang's batch_is_full latch only clears when a request finishes; compression frees room
        # earlier (admission_latch.py).
        allocator = self.token_to_kv_pool_allocator
        if _CLASSES and isinstance(allocator, _CLASSES["allocator"]):
            latch = self.__dict__.setdefault("_zipkv_admission_latch", AdmissionLatch())
            latch.release(running_batch, allocator)
            # with the radix cache on, the allocator reclaims from it (reclaim.py)
            ours = cast(Any, allocator)
            if ours.prefix_cache is None and not self.tree_cache.is_chunk_cache():
                ours.prefix_cache = _prefix_cache(self.tree_cache)
                ours.decode_reserve_pages = max(1, int(self.max_running_requests))
        return get_new_batch_prefill(self, running_batch)

    scheduler.get_new_batch_prefill = _get_new_batch_prefill


def _patch_pass_start(scheduler: Any) -> None:
    """Step 6: every rank's scheduler runs get_next_batch_to_run once a pass, alike: there the ranks agree
    on their headroom (a collective over the scheduler's gloo group, wired on the first pass)."""
    get_next_batch_to_run = scheduler.get_next_batch_to_run

    def _get_next_batch_to_run(self: Any, running_batch: Any, last_batch: Any):  # type: ignore[no-untyped-def]
        allocator = self.token_to_kv_pool_allocator
        ours = cast(Any, allocator)
        if _CLASSES and isinstance(allocator, _CLASSES["allocator"]) and ours.ranks is not None:
            if ours.ranks.reduce_min is None:
                ours.ranks.reduce_min = gloo_reduce_min(self.tp_cpu_group)
            ours.refresh_headroom()
        return get_next_batch_to_run(self, running_batch, last_batch)

    scheduler.get_next_batch_to_run = _get_next_batch_to_run


def _patch_decode_check(batch_class: Any) -> None:
    """Step 5: SGLang's decode check, when it fails, asks zipkv's allocator once more after it took in the
    frees and encodes still in flight and reclaimed (reclaim.decode_room). Its retraction loop calls the
    check after each request it releases, so it also stops as soon as the released pages are back."""
    check_decode_mem = batch_class.check_decode_mem

    def _check_decode_mem(self: Any, selected_indices: Any = None) -> bool:
        if check_decode_mem(self, selected_indices):
            return True
        allocator = self.token_to_kv_pool_allocator
        if not (_CLASSES and isinstance(allocator, _CLASSES["allocator"])):
            return False
        need = int(self.new_tokens_required_next_decode(selected_indices))
        return bool(cast(Any, allocator).decode_room(need))

    batch_class.check_decode_mem = _check_decode_mem


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
    """SGLang's radix cache as zipkv's allocator reclaims from it (reclaim.py)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    def evict_tokens(n: int) -> int:
        return int(tree_cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted)

    return PrefixCache(lambda: int(tree_cache.evictable_size()), evict_tokens)

"""What the SGLang adapter adds for traces and metrics (no sglang import here; CPU-tested).

Traces: the adapter's own spans come from what the parent process sees (submit, first token, finish,
SGLang's `cached_tokens`). Inside the scheduler, SGLang's own request tracing (`enable_trace`) records
its stages from host timestamps it already takes; the adapter turns it on when OTLP export is on and
hands it the worker span's context (`external_trace_header`), at `SGLANG_TRACE_LEVEL` 2 unless the
operator set one: level 3 adds a `decode_loop` span per decode step, i.e. per token.

Logs: the pool line the scheduler writes every so many forward steps (`log_pool_step`), which
bench/serving/sglang_e2e_metrics.py parses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from zipkv.worker.engine_stats import KernelsInUse, RequestTimings, decode_kernel_label, now_ns
from zipkv.worker.engines.sglang.host_timing import WAITED, take_host_ms
from zipkv.worker.otel_env import otlp_endpoint

if TYPE_CHECKING:  # the allocator package loads torch
    from zipkv.allocator import PagePool
    from zipkv.worker.engines.sglang.reclaim import ReclaimOutcome

log = logging.getLogger("zipkv.worker.sglang")
TRACE_LEVEL_ENV = "SGLANG_TRACE_LEVEL"
TRACE_LEVEL = "2"  # request_process, prefill_waiting, prefill_forward, decode_forward; no per-step spans


def tracing_kwargs(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`sglang.Engine` arguments that export SGLang's scheduler spans where the worker's go."""
    endpoint = otlp_endpoint(env)
    if not endpoint:
        return {}
    if not sglang_can_trace():
        log.warning(
            "SGLang's scheduler spans are off: its tracing needs opentelemetry-exporter-otlp-proto-http "
            "(pip install 'zipkv[sglang]'); the worker's own spans are exported"
        )
        return {}
    return {"enable_trace": True, "otlp_traces_endpoint": endpoint}


def sglang_can_trace() -> bool:
    """SGLang's tracing imports the OTLP HTTP exporter too and refuses to start without it."""
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:
        return False


def scheduler_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables the scheduler process must inherit when SGLang traces (its trace level)."""
    env = os.environ if env is None else env
    if not otlp_endpoint(env) or env.get(TRACE_LEVEL_ENV):
        return {}
    return {TRACE_LEVEL_ENV: TRACE_LEVEL}


@contextlib.contextmanager
def scheduler_environ(variables: dict[str, str]) -> Iterator[None]:
    """`variables` and `scheduler_env()` set while SGLang spawns its processes (they inherit them),
    restored after."""
    variables = {**variables, **scheduler_env()}
    before = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kernels_in_use(
    compression: bool, env: Mapping[str, str] | None = None, device: str = "cpu"
) -> KernelsInUse:
    """The kernels the scheduler runs on ``device``, from the same settings it reads (docs/sglang.md)."""
    import torch

    from zipkv.kernels.attention.decode_config import DECODE_IMPL_ENV, auto_impl, serving_format_version
    from zipkv.kernels.attention.extend import EXTEND_KERNEL_ENV

    env = os.environ if env is None else env
    where = torch.device(device)
    version = serving_format_version(where, env)
    impl = env.get(DECODE_IMPL_ENV) or auto_impl(version, where)
    return KernelsInUse(
        decode=decode_kernel_label(compression, env, impl),
        encode="triton" if compression else "none",
        extend=env.get(EXTEND_KERNEL_ENV, "restore"),
        page_format=f"v{version}",
    )


def request_timings(
    queued_ns: int, first_token_ns: int, prompt_tokens: int, cached_tokens: int, completion_tokens: int
) -> RequestTimings:
    """A finished request as the adapter saw it. SGLang admits inside its scheduler, so no admission
    time is known here (its prefill span then covers the queue wait too); one token per decode step."""
    decoded = max(completion_tokens - 1, 0)
    return RequestTimings(
        queued_ns=queued_ns,
        prefill_end_ns=first_token_ns,
        finished_ns=now_ns(),
        prefill_tokens=max(prompt_tokens - cached_tokens, 0) if first_token_ns else 0,
        prefix_hit_tokens=cached_tokens,
        decode_tokens=decoded,
        decode_steps=decoded,
    )


def log_pool_step(
    step: int, pool: PagePool, live_pages: int, decode_reqs: int, host_s: dict[str, float] | None = None
) -> None:
    """The pool line at forward step ``step`` (INFO), from host counters only (no device sync).
    block_fraction: blocks stored compressed over the blocks of compressed pages; decode_reqs: requests of
    the last decode batch (0 after a prefill); the times are sums since the previous line (PagePool.
    take_timings: device time of the encode, move and prefix-restore launches that have completed, host time
    of end_step; ``host_s``: the allocator's calls on the scheduling path, host_timing.py, in all and per
    call), so a log says how much of the steps between two lines the pool's own work took, and how much of
    that the host spent waiting for the device (waited: blocking readback drains; settle: syncs)."""
    if not log.isEnabledFor(logging.INFO):
        return
    st, t = pool.stats(), pool.take_timings()
    calls = take_host_ms(host_s) if host_s is not None else {}
    waited_ms = calls.pop(WAITED, 0.0)
    log.info(
        "zipkv pool step=%d compressed_pages=%d raw_pages=%d encoding_pages=%d ratio=%.4f "
        "headroom_pages=%d live_pages=%d compressed_blocks=%d compressed_page_blocks=%d "
        "block_fraction=%.4f decode_reqs=%d end_step_host_ms=%.1f encode_gpu_ms=%.1f move_gpu_ms=%.1f "
        "restore_gpu_ms=%.1f restores=%d alloc_host_ms=%.1f waited_host_ms=%.1f settle_host_ms=%.1f%s",
        step,
        st.compressed_pages,
        st.raw_pages,
        st.encoding_pages,
        st.compression_ratio,
        st.headroom_pages,
        live_pages,
        st.compressed_blocks,
        st.compressed_page_blocks,
        st.compressed_blocks / st.compressed_page_blocks if st.compressed_page_blocks else 0.0,
        decode_reqs,
        t["end_step_host_ms"],
        t["encode_gpu_ms"],
        t["move_gpu_ms"],
        t["restore_gpu_ms"],
        int(t["restore_spans"]),
        sum(calls.values()),
        waited_ms,
        t["settle_host_ms"],
        "".join(f" {name}_host_ms={ms:.1f}" for name, ms in calls.items()),
    )


def log_reclaim_failure(need_pages: int, outcome: ReclaimOutcome, pool: PagePool, free_ids: int) -> None:
    """One WARNING line when an allocation fails even after reclaiming from the prefix cache (SGLang then
    stops with "Prefill out of memory"): what was asked, what reclaim did, and where the pool's bytes are,
    so the line alone says whether page ids, dead bytes in chunks or locked cache pages were short."""
    st = pool.stats()
    log.warning(
        "zipkv reclaim failed need_pages=%d headroom_pages=%d free_page_ids=%d rounds=%d evicted_tokens=%d "
        "moved_pages=%d evictable_tokens=%d used_pages=%d committed_pages=%d encoding_pages=%d "
        "pool_chunks=%d free_bytes=%d dead_bytes=%d budget_bytes=%d",
        need_pages,
        outcome.headroom_pages,
        free_ids,
        outcome.rounds,
        outcome.evicted_tokens,
        outcome.moved_pages,
        outcome.evictable_tokens,
        st.used_pages,
        st.committed_pages,
        st.encoding_pages,
        st.pool_chunks,
        st.free_bytes,
        st.dead_bytes,
        st.budget_bytes,
    )

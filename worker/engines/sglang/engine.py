"""`SGLangEngine`: the worker's Engine interface over an in-process ``sglang.Engine`` (GPU).

Selected by ``WorkerSettings(engine="sglang")`` (worker/engine_factory.py ->
worker/engines/sglang/availability.py). SGLang runs its scheduler in a spawned process; zipkv's pool,
allocator and attention backend are installed there by the plugin (`zipkv.worker.engines.sglang.plugin`), or,
when zipkv is not installed as a distribution, by the Engine subclass from `seams.engine_class`.
``compression`` picks the backend: ``zipkv`` or its uncompressed twin ``zipkv_uncompressed`` (same pool and
kernel, no page compressed). What it hands SGLang (the engine's arguments, a request's sampling
parameters) is engine_args.py.

Threading: one thread drives `step`; each request is an asyncio task on SGLang's own event loop that turns
SGLang's stream into `EngineEvent`s; `step` runs that loop for a moment and returns what arrived.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import EngineEvent, EngineRequest, FinishReason, RequestRejected
from zipkv.worker.engine_stats import KVStats, now_ns
from zipkv.worker.engines.sglang.engine_args import (
    engine_kwargs,
    kv_bytes_per_token,
    model_config,
    sglang_sampling_params,
)
from zipkv.worker.engines.sglang.kv_stats_board import KVStatsBoard
from zipkv.worker.engines.sglang.owner_thread import OwnerThread
from zipkv.worker.engines.sglang.telemetry import kernels_in_use, request_timings, scheduler_environ
from zipkv.worker.settings import WorkerSettings

# The warm-up request: three pages of prompt (the prefill fills two, so the encoder runs) and a few decode
# steps, so the first user request does not pay the kernels' first compilation (769 ms against 111 ms for
# the next one, measured through the router on the H200 before the warm-up existed).
WARMUP_PROMPT_TOKENS = 48
WARMUP_NEW_TOKENS = 4
STEP_WAIT_S = 0.005  # how long one step lets SGLang's loop run when requests are in flight
LOADS_EVERY_S = 0.2  # capacity is read from SGLang's load snapshot at most this often
log = logging.getLogger("zipkv.worker.sglang")
_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP, "abort": FinishReason.ABORT}


@dataclass
class _Running:
    request: EngineRequest
    start_s: float
    emitted: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    task: Any = None
    queued_ns: int = 0
    first_token_ns: int = 0
    cached_tokens: int = 0  # prompt tokens SGLang served from its radix cache


@dataclass
class _Timings:
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    itl_ms: deque[float] = field(default_factory=lambda: deque(maxlen=256))


def warm_up(engine: Any) -> float:
    """Two short greedy requests through ``engine`` (``sglang.Engine``, where no loop runs); seconds taken.
    The second repeats the first, so with the radix cache on it also runs the prefix-hit path."""
    t0 = time.perf_counter()
    for _ in range(2):
        engine.generate(
            input_ids=[1] * WARMUP_PROMPT_TOKENS,
            sampling_params={"max_new_tokens": WARMUP_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
        )
    return time.perf_counter() - t0


class SGLangEngine:
    def __init__(self, settings: WorkerSettings, **engine_overrides: Any) -> None:
        if settings.model_path is None:
            raise ValueError("engine 'sglang' needs model_path: a local model folder (config.json at least)")
        from zipkv.worker.engines.sglang import seams

        self._seams = seams
        self.model_name = settings.model_name or os.path.basename(os.path.normpath(settings.model_path))
        self._kv_bytes_per_token = kv_bytes_per_token(settings.model_path)
        self._context_tokens = settings.max_context_tokens or int(
            model_config(settings.model_path).get("max_position_embeddings", 0)
        )
        kwargs = engine_kwargs(settings, settings.model_path, **engine_overrides)
        # The scheduler process publishes its pool's stats here for the replica's /metrics; it inherits
        # the board's name (and SGLang's trace level) from this process's environment when spawned.
        self._board = KVStatsBoard.create()
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"  # the scheduler's GPU is the parent's
        self._kernels = kernels_in_use(settings.compression, device=device)
        # Built on a thread that outlives it (see owner_thread.py): never on a helper that returns, and not
        # inside a running loop (a Ray Serve constructor's), which sglang.Engine would adopt.
        self._owner = OwnerThread("zipkv-sglang-owner")
        try:
            with scheduler_environ(self._board.env()):
                self._eng = self._owner.call(lambda: seams.engine_class()(**kwargs))
            warm_s = self._owner.call(lambda: warm_up(self._eng))
        except BaseException:
            self._owner.close()
            self._board.close()
            raise
        log.info("sglang engine warm in %.1f s (two %d-token requests)", warm_s, WARMUP_PROMPT_TOKENS)
        self._loop: asyncio.AbstractEventLoop = seams.event_loop(self._eng)
        self._running: dict[str, _Running] = {}
        self._events: list[EngineEvent] = []
        self._timings = _Timings()
        self._loads: Any = None
        self._loads_s = 0.0

    # ---- Engine protocol ----------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        if request.request_id in self._running:
            raise RequestRejected(f"request {request.request_id} is already running here", retryable=False)
        if self._context_tokens and len(request.prompt_token_ids) >= self._context_tokens:
            raise RequestRejected(
                f"prompt of {len(request.prompt_token_ids)} tokens does not fit the model's context "
                f"of {self._context_tokens}",
                retryable=False,
            )
        run = _Running(request, time.monotonic(), queued_ns=now_ns())
        self._running[request.request_id] = run
        run.task = self._loop.create_task(self._consume(run))

    def abort(self, request_id: str) -> bool:
        if request_id not in self._running:
            return False
        self._seams.abort_request(self._eng, request_id)
        return True

    def step(self, on_scheduled: Callable[[], None] | None = None) -> list[EngineEvent]:
        if on_scheduled is not None:
            on_scheduled()  # SGLang schedules on its own; capacity() reads its live load snapshot
        if self._running:
            self._drive(asyncio.sleep(STEP_WAIT_S))
        events, self._events = self._events, []
        return events

    def has_work(self) -> bool:
        return bool(self._running or self._events)

    def capacity(self) -> Capacity:
        loads = self._snapshot()
        total = int(getattr(loads, "max_total_num_tokens", 0))
        # SGLang's used = total - available - evictable; with the radix cache on it counts cached tokens at
        # full size although their pages are compressed, so it can go below zero (seen on the H200, milestone
        # 3). Clamped: the headroom reported to the router never exceeds the pool.
        used = min(max(int(getattr(loads, "num_used_tokens", 0)), 0), total)
        held = sum(len(r.request.prompt_token_ids) + r.emitted for r in self._running.values())
        committed = sum(r.request.sampling.max_new_tokens - r.emitted for r in self._running.values())
        started = [r for r in self._running.values() if r.first_token_s is None]
        return Capacity(
            headroom_tokens=max(total - used - committed, 0),
            committed_tokens=committed,
            total_tokens=total,
            # Estimate: KV bytes in use (SGLang counts them in raw-token units from zipkv's live capacity)
            # per token held by running requests. 1.0 while nothing runs.
            compression_ratio=min(used / held, 1.0) if held and used else 1.0,
            running_requests=int(getattr(loads, "num_running_reqs", len(self._running))),
            queued_requests=int(getattr(loads, "num_waiting_reqs", 0)),
            queued_prefill_tokens=sum(len(r.request.prompt_token_ids) for r in started),
            ttft_ms=_mean(self._timings.ttft_ms),
            itl_ms=_mean(self._timings.itl_ms) if self._running else 0.0,  # idle: no current step (.proto)
            max_context_tokens=self._context_tokens,
            kv_bytes_per_token=self._kv_bytes_per_token,
        )

    def kv_stats(self) -> KVStats | None:
        """The scheduler's pool as last published (every few forward steps; None before the first)."""
        return self._board.read(self._kernels)

    def shutdown(self) -> None:
        try:
            self._eng.shutdown()
        finally:
            self._owner.close()
            self._board.close()

    # ---- internals ----------------------------------------------------------------------------------
    def _snapshot(self) -> Any:
        now = time.monotonic()
        if self._loads is None or now - self._loads_s > LOADS_EVERY_S:
            self._loads = self._drive(self._seams.load_snapshot(self._eng))
            self._loads_s = now
        return self._loads

    def _drive(self, coro: Any) -> Any:
        """Run SGLang's loop until ``coro`` completes: in place on the worker's engine thread, which has no
        loop of its own; on the owner thread when the caller runs one (a Ray Serve replica's constructor
        asks for the first capacity inside Serve's running loop, where ``run_until_complete`` refuses, seen
        on the H200)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        return self._owner.call(lambda: self._loop.run_until_complete(coro))

    async def _consume(self, run: _Running) -> None:
        req, rid = run.request, run.request.request_id
        params = sglang_sampling_params(req.sampling)
        try:
            stream = await self._eng.async_generate(
                input_ids=list(req.prompt_token_ids),
                sampling_params=params,
                stream=True,
                rid=rid,
                external_trace_header=dict(req.trace_headers) or None,
            )
            async for out in stream:
                self._on_output(run, out)
        except Exception as exc:  # SGLang reports bad input and aborts as exceptions here
            self._finish(run, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")

    def _on_output(self, run: _Running, out: dict[str, Any]) -> None:
        ids = list(out.get("output_ids") or [])[run.emitted :]
        now = time.monotonic()
        meta = out.get("meta_info") or {}
        run.cached_tokens = int(meta.get("cached_tokens") or run.cached_tokens)
        if ids:
            if run.first_token_s is None:
                run.first_token_s, run.first_token_ns = now, now_ns()
                self._timings.ttft_ms.append((now - run.start_s) * 1e3)
            elif run.last_token_s is not None:
                self._timings.itl_ms.append((now - run.last_token_s) * 1e3 / len(ids))
            run.last_token_s = now
            run.emitted += len(ids)
        reason = meta.get("finish_reason")
        finish = None if reason is None else _FINISH.get(str(reason.get("type")), FinishReason.ERROR)
        if ids or finish is not None:
            self._events.append(self._event(run, tuple(ids), finish, "" if finish is None else str(reason)))
        if finish is not None:
            self._running.pop(run.request.request_id, None)

    def _finish(self, run: _Running, finish: FinishReason, message: str) -> None:
        if self._running.pop(run.request.request_id, None) is not None:
            self._events.append(self._event(run, (), finish, message))

    def _event(
        self, run: _Running, ids: tuple[int, ...], finish: FinishReason | None, msg: str
    ) -> EngineEvent:
        ttft = 0.0 if run.first_token_s is None else (run.first_token_s - run.start_s) * 1e3
        message = msg if finish in (FinishReason.ABORT, FinishReason.ERROR) else ""
        prompt = len(run.request.prompt_token_ids)
        timings = None
        if finish is not None:
            timings = request_timings(
                run.queued_ns, run.first_token_ns, prompt, run.cached_tokens, run.emitted
            )
        return EngineEvent(run.request.request_id, ids, finish, message, prompt, run.emitted, ttft, timings)


def _mean(values: deque[float]) -> float:
    return sum(values) / len(values) if values else 0.0

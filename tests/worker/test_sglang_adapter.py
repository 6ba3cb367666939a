"""The SGLang engine adapter's own logic on the CPU: SGLang's loop and owner thread, stream -> events,
capacity, the kv stats board. What it hands SGLang (arguments, KV sizing) is test_sglang_engine_args.py.

SGLang itself needs a GPU; here the adapter is fed SGLang-shaped stream outputs (the dicts
``Engine.async_generate(stream=True)`` yields with skip_tokenizer_init: cumulative ``output_ids``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from worker_helpers import LLAMA_8B

from zipkv.worker.engine import EngineRequest, FinishReason, SamplingOptions
from zipkv.worker.engine_stats import EncodeCounts, KVStats, now_ns
from zipkv.worker.engines.sglang.engine import WARMUP_PROMPT_TOKENS, SGLangEngine, _Running, _Timings
from zipkv.worker.engines.sglang.kv_stats_board import KVStatsBoard
from zipkv.worker.engines.sglang.owner_thread import OwnerThread
from zipkv.worker.engines.sglang.telemetry import kernels_in_use
from zipkv.worker.settings import WorkerSettings


def _running_loop_or_none() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def test_sglangs_loop_is_driven_where_no_other_loop_runs_as_inside_a_serve_replica_constructor() -> None:
    eng = bare_engine()
    eng._loop, eng._owner = asyncio.new_event_loop(), OwnerThread("test-owner")

    async def where() -> tuple[asyncio.AbstractEventLoop | None, str]:
        return _running_loop_or_none(), threading.current_thread().name

    async def constructor() -> tuple[asyncio.AbstractEventLoop | None, str]:  # Ray Serve calls __init__ so
        assert _running_loop_or_none() is not None
        return eng._drive(where())

    try:
        assert asyncio.run(constructor()) == (eng._loop, "test-owner")  # SGLang's loop, off Serve's
        assert eng._drive(where()) == (eng._loop, threading.current_thread().name)  # no loop here: in place
    finally:
        eng._owner.close()
        eng._loop.close()


def bare_engine() -> SGLangEngine:
    eng = object.__new__(SGLangEngine)  # no sglang.Engine behind it: only the stream bookkeeping runs
    eng._running, eng._events, eng._timings = {}, [], _Timings()
    return eng


def test_stream_outputs_become_deltas_and_one_finish() -> None:
    eng = bare_engine()
    req = EngineRequest("r1", (1, 2, 3), SamplingOptions(max_new_tokens=3))
    run = eng._running["r1"] = _Running(req, time.monotonic())
    eng._on_output(run, {"output_ids": [7], "meta_info": {}})
    eng._on_output(run, {"output_ids": [7, 8], "meta_info": {}})
    eng._on_output(run, {"output_ids": [7, 8, 9], "meta_info": {"finish_reason": {"type": "length"}}})
    events = eng.step()
    assert [e.token_ids for e in events] == [(7,), (8,), (9,)]
    assert [e.finish for e in events] == [None, None, FinishReason.LENGTH]
    assert events[-1].completion_tokens == 3 and events[-1].prompt_tokens == 3 and events[-1].message == ""
    assert not eng.has_work() and len(eng._timings.itl_ms) == 2


def test_itl_is_reported_while_requests_run_and_not_once_idle() -> None:
    """The step times of the last burst stay in the window, but an idle engine reports none (a stale slow
    step kept an idle worker from the router's picks)."""
    eng = bare_engine()
    eng._snapshot = lambda: None  # type: ignore[method-assign]  # SGLang's loads: none here
    eng._context_tokens, eng._kv_bytes_per_token = 4096, 1024
    run = eng._running["r1"] = _Running(EngineRequest("r1", (1, 2), SamplingOptions(max_new_tokens=3)), 0.0)
    eng._on_output(run, {"output_ids": [7], "meta_info": {}})
    eng._on_output(run, {"output_ids": [7, 8], "meta_info": {}})
    assert eng.capacity().itl_ms > 0.0
    eng._on_output(run, {"output_ids": [7, 8, 9], "meta_info": {"finish_reason": {"type": "length"}}})
    eng.step()
    assert not eng._running and eng._timings.itl_ms and eng.capacity().itl_ms == 0.0


def test_abort_and_errors_carry_a_message() -> None:
    eng = bare_engine()
    run = eng._running["r2"] = _Running(EngineRequest("r2", (1,)), time.monotonic())
    eng._on_output(
        run, {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "bye"}}}
    )
    (event,) = eng.step()
    assert event.finish is FinishReason.ABORT and "bye" in event.message
    run = eng._running["r3"] = _Running(EngineRequest("r3", (1,)), time.monotonic())
    eng._finish(run, FinishReason.ERROR, "ValueError: too long")
    (event,) = eng.step()
    assert event.finish is FinishReason.ERROR and "too long" in event.message


def test_capacity_inside_a_serve_constructor_drives_sglangs_loop_off_the_running_loop() -> None:
    """Ray Serve builds the replica inside its own running loop and the worker loop reads the first
    capacity there; driving SGLang's loop with run_until_complete on that thread raises (H200 run)."""
    eng = bare_engine()
    own_loop = asyncio.new_event_loop()
    snapshot = type("Snap", (), {"max_total_num_tokens": 1000, "num_used_tokens": 250, "num_running_reqs": 0})

    async def load_snapshot(_: object) -> object:
        return snapshot

    eng._loop, eng._eng, eng._loads, eng._loads_s = own_loop, None, None, 0.0
    eng._owner = OwnerThread("test-owner")
    eng._seams = type("Seams", (), {"load_snapshot": staticmethod(load_snapshot)})  # type: ignore[assignment]
    eng._kv_bytes_per_token, eng._context_tokens = 131072, 8192

    async def constructor() -> int:
        return eng.capacity().total_tokens

    try:
        assert asyncio.run(constructor()) == 1000
        eng._loads = None
        assert eng.capacity().headroom_tokens == 750  # no loop running here: driven in place
        # SGLang's count below zero (radix cache holding compressed pages, H200 log "#token: -2800"): the
        # headroom stays within the pool
        snapshot.num_used_tokens, eng._loads = -2800, None  # type: ignore[attr-defined]
        assert eng.capacity().headroom_tokens == 1000
    finally:
        eng._owner.close()
        own_loop.close()


class _StandInEngine:
    """Stands in for ``sglang.Engine``, which cannot start without a GPU: records where it is called."""

    calls: ClassVar[list[tuple[object, ...]]] = []
    fail_warm_up: ClassVar[bool] = False

    def __init__(self, **kwargs: object) -> None:
        self.calls.append(("init", threading.current_thread().name))
        self.loop = asyncio.new_event_loop()
        self.board_file = os.environ.get("ZIPKV_KV_STATS_FILE")  # what its scheduler would inherit

    def generate(self, input_ids: list[int], sampling_params: dict[str, object]) -> None:
        name = threading.current_thread().name
        self.calls.append(("generate", name, len(input_ids), _running_loop_or_none() is None))
        if self.fail_warm_up:
            raise RuntimeError("CUDA error: out of memory")

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))
        self.loop.close()


def test_engine_is_built_and_warmed_on_its_owner_thread_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zipkv.worker.engines.sglang import seams as sglang_seams

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    settings = WorkerSettings(engine="sglang", model_path=str(tmp_path), kv_budget_bytes=1 << 30)
    monkeypatch.setattr(sglang_seams, "engine_class", lambda: _StandInEngine)
    _StandInEngine.calls = []

    async def constructor() -> SGLangEngine:  # Ray Serve builds the replica inside its running loop
        return SGLangEngine(settings)

    eng = asyncio.run(constructor())
    owner = "zipkv-sglang-owner"
    warm = ("generate", owner, WARMUP_PROMPT_TOKENS, True)
    assert _StandInEngine.calls == [("init", owner), warm, warm]
    assert eng._eng.board_file == str(eng._board.path) and "ZIPKV_KV_STATS_FILE" not in os.environ
    eng.shutdown()
    assert not eng._board.path.exists()
    assert _StandInEngine.calls[-1] == ("shutdown",) and not eng._owner._thread.is_alive()

    _StandInEngine.fail_warm_up = True  # a failed warm-up fails the start, and leaves no thread behind
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            SGLangEngine(settings)
    finally:
        _StandInEngine.fail_warm_up = False
    assert not any(t.name == owner and t.is_alive() for t in threading.enumerate())


def test_a_finished_request_carries_its_timings_and_prefix_hit() -> None:
    eng = bare_engine()
    req = EngineRequest("r4", tuple(range(48)), SamplingOptions(max_new_tokens=3))
    run = eng._running["r4"] = _Running(req, time.monotonic(), queued_ns=now_ns())
    eng._on_output(run, {"output_ids": [7], "meta_info": {"cached_tokens": 32}})
    eng._on_output(run, {"output_ids": [7, 8, 9], "meta_info": {"finish_reason": {"type": "length"}}})
    first, last = eng.step()
    assert first.timings is None  # only the finish carries them
    t = last.timings
    assert t is not None
    assert (t.prefill_tokens, t.prefix_hit_tokens) == (16, 32)  # 48-token prompt, 32 from the radix cache
    assert t.decode_tokens == t.decode_steps == 2  # the first token comes out of the prefill
    assert t.queued_ns <= t.prefill_end_ns <= t.finished_ns and t.admitted_ns == 0  # admission unseen here


def test_the_worker_spans_context_goes_to_sglangs_scheduler() -> None:
    eng = bare_engine()
    seen: dict[str, object] = {}

    async def async_generate(**kwargs: object) -> object:
        seen.update(kwargs)

        async def outputs() -> object:
            yield {"output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}}

        return outputs()

    eng._eng = type("Eng", (), {"async_generate": staticmethod(async_generate)})()
    headers = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
    req = EngineRequest("r5", (1, 2), SamplingOptions(max_new_tokens=1), trace_headers=headers)
    run = eng._running["r5"] = _Running(req, time.monotonic())
    asyncio.run(eng._consume(run))
    assert seen["external_trace_header"] == dict(headers) and seen["rid"] == "r5"
    (event,) = eng.step()
    assert event.finish is FinishReason.STOP


def test_kv_stats_come_from_the_schedulers_board_with_the_kernels_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZIPKV_EXTEND_KERNEL", "fused")
    eng = bare_engine()
    eng._board, eng._kernels = KVStatsBoard.create(), kernels_in_use(compression=True)
    try:
        assert eng.kv_stats() is None  # the scheduler has not published yet
        eng._board.publish(KVStats(1 << 20, 3000, 4096, 0, 1, 0, eng._kernels, EncodeCounts(1, 1)))
        stats = eng.kv_stats()
        assert stats is not None and stats.compressed_pages == 1 and stats.encode.launches == 1
        assert (stats.kernels.decode, stats.kernels.extend) == ("triton_fused", "fused")
    finally:
        eng._board.close()
    assert kernels_in_use(compression=False).decode == "triton_fused_uncompressed_twin"
    monkeypatch.setenv("ZIPKV_DECODE_IMPL", "hopper")
    monkeypatch.setenv("ZIPKV_DECODE_KERNEL", "64:4:2:2:2:0")
    assert kernels_in_use(compression=True).decode == "hopper_fused[64:4:2:2:2:0]"

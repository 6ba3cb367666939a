"""The capacity report counts a request from the moment the engine takes it: queued, then in prefill
(one step that can last seconds for a long prompt), not only from its first token."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import EngineRequest, SamplingOptions
from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.engines.reference.model import TINY_BOS, load_model
from zipkv.worker.loop import EngineLoop, wait_until


class HeldForward:
    """Holds the engine's model pass until the test lets it go: a prefill that takes as long as needed."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.passes = 0  # model passes entered so far
        self.release = threading.Event()
        self._inner = engine._forward
        engine._forward = self._forward  # type: ignore[method-assign]

    def _forward(self, batch: list[Any]) -> list[int]:
        self.passes += 1
        assert self.release.wait(30), "the test never released the forward pass"
        self.release.clear()
        return self._inner(batch)


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _request(rid: str, prompt_tokens: int) -> EngineRequest:
    ids = (TINY_BOS, *torch.randint(0, 256, (prompt_tokens - 1,), generator=torch.Generator().manual_seed(3)))
    return EngineRequest(rid, tuple(int(i) for i in ids), SamplingOptions(max_new_tokens=4, ignore_eos=True))


def test_requests_in_prefill_and_queued_are_in_the_capacity_report(
    running_loop: asyncio.AbstractEventLoop,
) -> None:
    torch.set_num_threads(1)
    config = ReferenceEngineConfig(kv_budget_bytes=8 << 20, max_running_requests=1)
    engine = ReferenceEngine(load_model(None, "cpu"), config, "cpu")
    held = HeldForward(engine)
    loop = EngineLoop(engine, running_loop)
    loop.start()
    try:
        idle: Capacity = loop.capacity()
        asyncio.run_coroutine_threadsafe(loop.submit(_request("long", 1500)), running_loop).result(10)
        assert wait_until(lambda: held.passes == 1, 10)  # the 1500-token prefill is under way, held
        during = loop.capacity()
        assert during.running_requests == 1, during
        assert during.headroom_tokens <= idle.headroom_tokens - 1504, (idle, during)  # its reservation counts
        assert during.committed_tokens >= 1504 - 1500, during
        assert during.queued_prefill_tokens == 1500, during  # its prefill is still to come
        # a second request arrives while the first prefills: taken after this step, queued behind it
        asyncio.run_coroutine_threadsafe(loop.submit(_request("next", 700)), running_loop)
        held.release.set()
        assert wait_until(lambda: held.passes == 2, 10)  # the first request's decode step, held
        queued = loop.capacity()
        assert (queued.running_requests, queued.queued_requests) == (1, 1), queued
        assert queued.queued_prefill_tokens == 700, queued
    finally:
        engine._forward = held._inner  # type: ignore[method-assign]
        held.release.set()
        loop.stop()

"""Admission from compressed capacity: at a small KV budget more requests run at once with compression
on than off, none fails for lack of memory, and the tokens are the same; at page formats v2 and v3."""

from __future__ import annotations

import pytest
import torch

from zipkv.worker.engine import EngineRequest, FinishReason, SamplingOptions
from zipkv.worker.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.reference.model import TINY_BOS, load_model


def _burst(n: int) -> list[EngineRequest]:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        ids = (TINY_BOS, *torch.randint(0, 256, (255,), generator=g).tolist())
        out.append(EngineRequest(f"r{i}", ids, SamplingOptions(max_new_tokens=32, ignore_eos=True)))
    return out


def _run(compression: bool, version: int) -> tuple[int, dict[str, list[int]], dict[str, FinishReason]]:
    tiny = load_model(None, "cpu")
    config = ReferenceEngineConfig(
        kv_budget_bytes=4 << 20, chunk_bytes=64 << 10, compression=compression, format_version=version
    )
    engine = ReferenceEngine(tiny, config, "cpu")
    reqs = _burst(24)
    for r in reqs:
        engine.add_request(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    finish: dict[str, FinishReason] = {}
    most = 0
    while engine.has_work():
        for e in engine.step():  # an OutOfPages inside a step would fail the test here
            tokens[e.request_id].extend(e.token_ids)
            if e.finish is not None:
                finish[e.request_id] = e.finish
        most = max(most, engine.capacity().running)
    return most, tokens, finish


@pytest.mark.parametrize("version", [2, 3])
def test_more_requests_run_concurrently_with_compression(version: int) -> None:
    torch.set_num_threads(1)
    on_most, on_tokens, on_finish = _run(True, version)
    off_most, off_tokens, off_finish = _run(False, version)
    assert on_most > off_most, (on_most, off_most)
    assert set(on_finish.values()) == set(off_finish.values()) == {FinishReason.LENGTH}
    assert len(on_finish) == len(off_finish) == 24
    assert on_tokens == off_tokens

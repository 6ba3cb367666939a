"""Admission from compressed capacity: at a small KV budget more requests run at once with compression
on than off, none fails for lack of memory, and the tokens are the same; at page formats v2 and v3."""

from __future__ import annotations

import pytest
import torch

from zipkv.worker.engine import EngineRequest, FinishReason, SamplingOptions
from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.engines.reference.model import TINY_BOS, LoadedModel, build_model, load_model, tiny_config


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
        most = max(most, engine.capacity().running_requests)
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


def _smollm2_kv_shape(max_context_tokens: int = 8192) -> LoadedModel:
    """SmolLM2-135M's KV shape (30 layers, 3 KV heads x 64) with tiny compute and random weights."""
    config = tiny_config(num_layers=30, hidden=64, max_context_tokens=max_context_tokens)
    config.num_attention_heads = config.num_key_value_heads = 3
    config.intermediate_size = 64
    return build_model(config, "smollm2-kv-shape", "cpu")


@pytest.mark.parametrize("budget_mib", [64, 256, 1024])
def test_idle_headroom_is_the_same_with_compression_on_and_off(budget_mib: int) -> None:
    """The encode margin is held only out of room compression freed, so idle headroom does not drop."""
    model = _smollm2_kv_shape()
    free = {}
    for compression in (True, False):
        config = ReferenceEngineConfig(kv_budget_bytes=budget_mib << 20, compression=compression)
        free[compression] = ReferenceEngine(model, config, "cpu").capacity().headroom_tokens
    assert free[True] == free[False] > 0


@pytest.mark.parametrize(
    ("budget_mib", "prompt_tokens", "max_new"), [(64, 296, 8), (24, 100, 8), (40, 200, 8)]
)
def test_compression_never_admits_fewer_at_small_budgets(
    budget_mib: int, prompt_tokens: int, max_new: int
) -> None:
    """A burst of 8 requests at a KV budget that holds 8 of them with little to spare (64 MiB: 168 pages a
    layer, 8 x 19 needed): at every step at least as many run with compression on as off (before the
    margin was sized, 7 against 8 at 64 MiB), and the tokens are the same."""
    torch.set_num_threads(1)
    model = _smollm2_kv_shape()
    running: dict[bool, list[int]] = {}
    tokens: dict[bool, dict[str, list[int]]] = {}
    for compression in (True, False):
        config = ReferenceEngineConfig(kv_budget_bytes=budget_mib << 20, compression=compression)
        engine = ReferenceEngine(model, config, "cpu")
        for i in range(8):
            g = torch.Generator().manual_seed(7 + i)
            ids = (TINY_BOS, *torch.randint(0, 256, (prompt_tokens - 1,), generator=g).tolist())
            engine.add_request(
                EngineRequest(f"r{i}", ids, SamplingOptions(max_new_tokens=max_new, ignore_eos=True))
            )
        running[compression], tokens[compression] = [], {f"r{i}": [] for i in range(8)}
        while engine.has_work():
            for e in engine.step():
                tokens[compression][e.request_id].extend(e.token_ids)
            running[compression].append(engine.capacity().running_requests)
    steps = min(len(running[True]), len(running[False]))
    assert all(on >= off for on, off in zip(running[True][:steps], running[False][:steps], strict=True)), (
        running[True][:8],
        running[False][:8],
    )
    assert tokens[True] == tokens[False]

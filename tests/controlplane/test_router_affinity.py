"""Prefix affinity through the router: a conversation's second turn goes where its first went, over real
HTTP and gRPC to scripted workers, while that worker has the headroom; with the scorer off it does not."""

from __future__ import annotations

import httpx
import pytest
from router_harness import MODEL, Stack, stack

FIRST = "You are a helpful assistant. " * 4 + "User: what is a KV cache?"  # ~130 byte tokens
SECOND = FIRST + " Assistant: the keys and values of past tokens. User: and why compress it?"


def turn(s: Stack, prompt: str) -> str:
    r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.headers["x-zipkv-worker"]


@pytest.mark.parametrize(("weight", "second_on"), [(1.0, "w-a"), (0.0, "w-b")])
def test_the_second_turn_follows_the_first_when_headroom_allows(weight: float, second_on: str) -> None:
    # 16-token blocks: the first turn fills 8, the second 12, of which the first 8 are shared.
    placement = {"weight_prefix_affinity": weight, "prefix_block_tokens": 16}
    with stack(placement=placement) as s:
        a = s.add_worker(total_tokens=200_000, worker_id="w-a")  # more headroom: the first turn goes here
        b = s.add_worker(total_tokens=100_000, worker_id="w-b")
        assert turn(s, FIRST) == a.worker_id
        # Now a reports a queued request (queue scorer 1/2 against b's 1): without affinity the second
        # turn goes to b; a still has the headroom, and 8 of 12 blocks there outweigh its queue.
        assert s.report(a, queued_requests=1).accepted
        assert s.report(b).accepted
        assert turn(s, SECOND) == second_on
        # A prompt sharing nothing with the conversation is placed on load alone.
        assert turn(s, "x" * 200) == b.worker_id


def test_affinity_yields_to_the_headroom_filter() -> None:
    with stack(placement={"prefix_block_tokens": 16}) as s:
        a = s.add_worker(total_tokens=200_000, worker_id="w-a")
        b = s.add_worker(total_tokens=100_000, worker_id="w-b")
        assert turn(s, FIRST) == a.worker_id
        assert s.report(a, headroom_tokens=10).accepted  # a is full: the second turn must go to b
        assert turn(s, SECOND) == b.worker_id

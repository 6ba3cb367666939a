"""bench/serving/trace_workload.py: the Mooncake trace as token-id prompts, the context cap and scaled
arrivals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving import trace_workload as tw


def _trace(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_committed_trace_is_whole() -> None:
    reqs = tw.load_trace()
    s = tw.summary(reqs)
    assert s["requests"] == 12031 and s["capped"] == 0  # Llama-3.1-8B's context holds every request
    assert round(s["input_tokens_mean"]) == 12035 and s["input_tokens_max"] == 126195
    assert round(s["native_rate_rps"], 2) == 3.40


def test_equal_block_ids_are_equal_token_blocks(tmp_path: Path) -> None:
    # Two requests share blocks 7 and 8; the second's third block differs; the first ends in a partial block.
    path = _trace(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 3000, "input_length": 1536, "output_length": 5, "hash_ids": [7, 8, 10]},
        ],
    )
    a, b = tw.load_trace(path=path)
    ia, ib = tw.prompt_token_ids(a, 128000), tw.prompt_token_ids(b, 128000)
    assert (len(ia), len(ib)) == (1100, 1536)
    assert ia[:1024] == ib[:1024]  # the shared prefix: two equal blocks
    assert ia[1024:] != ib[1024:1100]  # block 9 is not block 10
    assert ia[1024:] == list(tw.block_token_ids(9, 128000))[:76]  # the partial block is a prefix of block 9
    assert max(ia + ib) < 128000 and min(ia + ib) >= 0
    # Another salt: the same structure with other tokens (each rate of the serving sweep gets its own).
    sa, sb = tw.prompt_token_ids(a, 128000, salt=1), tw.prompt_token_ids(b, 128000, salt=1)
    assert sa[:1024] == sb[:1024] and sa[:512] != ia[:512]


def test_the_cap_keeps_the_output_and_the_leading_blocks(tmp_path: Path) -> None:
    path = _trace(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1500, "output_length": 300, "hash_ids": [1, 2, 3]},
            {"timestamp": 0, "input_length": 600, "output_length": 100, "hash_ids": [1, 4]},
        ],
    )
    long, short = tw.load_trace(max_context_tokens=1024, path=path)
    assert (long.input_tokens, long.output_tokens, long.capped) == (1024 - 256, 256, True)  # output <= ctx/4
    assert long.block_ids == (1, 2)  # 768 tokens: one full block and half of the next
    assert (short.input_tokens, short.output_tokens, short.capped) == (600, 100, False)
    assert len(tw.prompt_token_ids(long, 259)) == 768


def test_arrivals_scale_to_the_requested_rate(tmp_path: Path) -> None:
    recs = [
        {"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [t]} for t in (0, 0, 3000, 9000)
    ]
    reqs = tw.load_trace(path=_trace(tmp_path, recs))
    assert tw.native_rate_rps(reqs) == pytest.approx(3 / 9.0)
    arr = tw.arrivals_s(reqs, rate_rps=2.0)
    assert arr == pytest.approx([0.0, 0.0, 0.5, 1.5])  # (n - 1) / span = 3 / 1.5 = 2 req/s, bursts kept
    with pytest.raises(ValueError, match="rate"):
        tw.arrivals_s(reqs, 0.0)


def test_a_record_whose_blocks_do_not_cover_its_input_is_refused(tmp_path: Path) -> None:
    path = _trace(tmp_path, [{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}])
    with pytest.raises(ValueError, match="2 hash ids for 1025"):
        tw.load_trace(path=path)

"""The Mooncake conversation trace as requests: token-id prompts, the context cap, arrivals at a chosen rate.

One workload for every system and for the cluster simulation (bench/sim/cluster_sim.py):

- Prompts: each 512-token block id of the trace (`hash_ids`) becomes 512 token ids drawn from a generator
  seeded by (seed, salt, block id), so equal ids give equal token blocks and a shared run of leading ids is
  a shared prefix, as the radix cache sees it. A request's last block is partial: it takes the first
  tokens of its block. Ids are below `plain_vocab` (the model's ids that are not special tokens). `salt`
  gives the same structure with other tokens: the serving sweep salts each rate's run, so a later rate
  cannot hit prefixes cached by an earlier one, on any system.
- The cap, applied to every system alike: a request whose input + output exceeds `max_context_tokens` keeps
  its output length (capped at a quarter of the context, which only a tiny test model needs) and loses the
  tail of its prompt, so its leading (shared) blocks stay. Nothing is dropped: each system sees the same
  requests at the same times. Llama-3.1-8B's context (131,072) holds every request of this trace, so the
  GPU run caps none; the tiny CPU model's context caps most.
- Arrivals: the trace's own timestamps (3 s ticks, bursts kept), scaled so that the window's mean rate
  ((n - 1) / span) is the requested rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from bench.paths import DATA

BLOCK_TOKENS = 512
DEFAULT_TRACE = DATA / "traces" / "mooncake_conversation_trace.jsonl"
LLAMA3_CONTEXT_TOKENS = 131072
LLAMA3_PLAIN_VOCAB = 128000  # ids 128000..128255 are Llama 3's special tokens
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B: layers x KV heads x dim x (K, V) x BF16 = 131,072


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int  # position in the trace file
    trace_s: float  # the trace's own arrival time, seconds from its first request
    input_tokens: int  # after the cap
    output_tokens: int  # after the cap
    block_ids: tuple[int, ...]  # the prompt's 512-token blocks after the cap (the last may be partial)
    capped: bool

    def block_tokens(self, k: int) -> int:
        """Tokens of block k of this prompt (512 except a partial last block)."""
        return min(BLOCK_TOKENS, self.input_tokens - k * BLOCK_TOKENS)


def _records(path: Path) -> Iterator[dict[str, object]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def cap_request(index: int, rec: dict[str, object], t0_ms: float, max_context_tokens: int) -> TraceRequest:
    """One trace record under the context cap (module doc)."""
    inp, out = int(rec["input_length"]), int(rec["output_length"])  # type: ignore[call-overload]
    blocks = tuple(int(b) for b in rec["hash_ids"])  # type: ignore[attr-defined]
    if len(blocks) != -(-inp // BLOCK_TOKENS):
        raise ValueError(f"trace record {index}: {len(blocks)} hash ids for {inp} input tokens")
    out_c = max(1, min(out, max_context_tokens // 4))
    inp_c = max(1, min(inp, max_context_tokens - out_c))
    return TraceRequest(
        index=index,
        trace_s=(float(rec["timestamp"]) - t0_ms) / 1000.0,  # type: ignore[arg-type]
        input_tokens=inp_c,
        output_tokens=out_c,
        block_ids=blocks[: -(-inp_c // BLOCK_TOKENS)],
        capped=(inp_c, out_c) != (inp, out),
    )


def load_trace(
    max_context_tokens: int = LLAMA3_CONTEXT_TOKENS,
    limit: int | None = None,
    offset: int = 0,
    path: Path = DEFAULT_TRACE,
) -> list[TraceRequest]:
    """Requests `offset .. offset + limit` of the trace (all by default), capped, times from the first."""
    recs = list(_records(path))[offset : None if limit is None else offset + limit]
    if not recs:
        raise ValueError(f"no trace records at offset {offset} (limit {limit}) in {path}")
    t0 = float(recs[0]["timestamp"])  # type: ignore[arg-type]
    return [cap_request(offset + i, r, t0, max_context_tokens) for i, r in enumerate(recs)]


def native_rate_rps(requests: list[TraceRequest]) -> float:
    span_s = requests[-1].trace_s - requests[0].trace_s
    if len(requests) < 2 or span_s <= 0:
        raise ValueError("a rate needs at least two requests at different times")
    return (len(requests) - 1) / span_s


def arrivals_s(requests: list[TraceRequest], rate_rps: float) -> list[float]:
    """Arrival times (seconds from the first) scaled so that (n - 1) / span == rate_rps."""
    if rate_rps <= 0:
        raise ValueError(f"rate must be > 0, got {rate_rps}")
    scale = native_rate_rps(requests) / rate_rps
    t0 = requests[0].trace_s
    return [(r.trace_s - t0) * scale for r in requests]


@lru_cache(maxsize=65536)
def block_token_ids(block_id: int, plain_vocab: int, seed: int = 0, salt: int = 0) -> tuple[int, ...]:
    """The 512 token ids of one trace block (same arguments, same ids)."""
    rng = np.random.default_rng([seed, salt, block_id])
    return tuple(int(x) for x in rng.integers(0, plain_vocab, BLOCK_TOKENS))


def prompt_token_ids(req: TraceRequest, plain_vocab: int, seed: int = 0, salt: int = 0) -> list[int]:
    ids: list[int] = []
    for k, b in enumerate(req.block_ids):
        ids.extend(block_token_ids(b, plain_vocab, seed, salt)[: req.block_tokens(k)])
    return ids


def summary(requests: list[TraceRequest]) -> dict[str, float]:
    inputs = [r.input_tokens for r in requests]
    return {
        "requests": len(requests),
        "capped": sum(r.capped for r in requests),
        "input_tokens_mean": round(statistics.fmean(inputs), 1),
        "input_tokens_max": max(inputs),
        "output_tokens_mean": round(statistics.fmean(r.output_tokens for r in requests), 1),
        "span_s": round(requests[-1].trace_s - requests[0].trace_s, 3),
        "native_rate_rps": round(native_rate_rps(requests), 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.serving.trace_workload", description=__doc__.split("\n")[0]
    )
    p.add_argument("--max-context-tokens", type=int, default=LLAMA3_CONTEXT_TOKENS)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--offset", type=int, default=0)
    args = p.parse_args(argv)
    print(json.dumps(summary(load_trace(args.max_context_tokens, args.limit, args.offset)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

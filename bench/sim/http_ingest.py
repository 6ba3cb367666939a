"""The order in which requests sent at the same instant reach the server: their bodies' TCP receive windows.

Every client sends a prompt as a JSON list of token ids on its own HTTP connection (bench_serving opens a
session per request). The order below is what the records show; the mechanism is our reading of it, not
verified on the machine: a body that fits the server's initial TCP receive buffer (Linux's default
`net.ipv4.tcp_rmem` middle value, 128 KiB) is in the server's socket at once; a larger one needs the server to
read the first window before the client can send the rest, and the server's single event loop first parses
whatever bodies are complete. So of the requests sent together, the one-window bodies reach the scheduler in
send order and the larger ones after them (fewer windows first), whatever their send order.

The H100 serving sweep shows it (bench/results/serving_goodput_balanced_records.tgz and the SGLang server's
run before it, the per-request records against the server logs): of the 16 requests the trace sends at one
instant, SGLang's server and zipkv's router alike prefilled the 146 KB body (20,506 tokens) after the five
bodies of 42-118 KB sent after it and the 188 KB one after the four sent after it in all eight runs, and the
621 KB one (87,169 tokens, sent second) after all fourteen one-window bodies in the six runs that served it
(it and the 327 KB one came in either order: three runs each); in the burst before, the 165 and 192 KB
bodies went after the 75 and 124 KB ones sent after them in seven of the eight. SGLang's
scheduler is first come, first served (`--schedule-policy fcfs`: calc_priority leaves the queue as it is),
and its "Prefill batch" lines' #new-seq / #cached-token sequence is first come, first served in that order.
No delay is added: the late bodies were in the queue within one or two prefill batches (#pending-token of
the next "Prefill batch" lines counts them), sooner than the queue ahead of them drains; the order is what
moves TTFT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.serving.trace_workload import LLAMA3_PLAIN_VOCAB, TraceRequest

RECEIVE_WINDOW_BYTES = 131072  # Linux's default initial TCP receive buffer (tcp_rmem's middle value)
JSON_SEPARATOR_BYTES = 2  # ", " between ids: json.dumps' default separators (bench_serving, aiohttp)


def json_bytes_per_token(plain_vocab: int = LLAMA3_PLAIN_VOCAB) -> float:
    """Mean bytes of one id in a JSON list of ids drawn uniformly below `plain_vocab` (trace_workload.py):
    its decimal digits and the separator. 7.13 for Llama 3's 128,000 plain ids."""
    if plain_vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {plain_vocab}")
    digits, low, width = 0, 0, 1
    while low < plain_vocab:
        high = min(10**width, plain_vocab)
        digits += (high - low) * width
        low, width = high, width + 1
    return digits / plain_vocab + JSON_SEPARATOR_BYTES


def receive_windows(input_tokens: int, bytes_per_token: float) -> int:
    """TCP receive windows the request's prompt body needs (the rest of the JSON body is ~150 bytes)."""
    return max(1, math.ceil(input_tokens * bytes_per_token / RECEIVE_WINDOW_BYTES))


def ingest_order(
    requests: Sequence[TraceRequest], arrivals_s: Sequence[float], plain_vocab: int = LLAMA3_PLAIN_VOCAB
) -> list[int]:
    """Indices of `requests` in the order the server takes them in: by send time; of those sent at the same
    time, by the receive windows their bodies need, then in send order."""
    per_token = json_bytes_per_token(plain_vocab)
    return sorted(
        range(len(requests)),
        key=lambda i: (arrivals_s[i], receive_windows(requests[i].input_tokens, per_token), i),
    )

"""HTTP/2 keepalive on the router -> worker hop, so that a worker whose host vanished (node lost, network
partitioned: no reset ever arrives) fails its streams within seconds instead of at the Generate deadline.

The router pings every `dispatch.keepalive_s` while calls are open and gives a worker
`dispatch.keepalive_timeout_s` to answer; the gRPC stream then fails with UNAVAILABLE and the request goes
on as after any lost worker (reopen.py: a non-streamed one starts again elsewhere, a stream resumes). A gRPC
server refuses pings more often than every 5 minutes by default, and answers a pinging client with GOAWAY,
which would fail a long prefill's silent stream; so every worker server accepts them (`SERVER_OPTIONS`).
"""

from __future__ import annotations

from typing import Any

# The most often a worker accepts a ping when no data flows; the router's period may not be shorter.
MIN_PING_INTERVAL_MS = 500

SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.max_ping_strikes", 0),  # never GOAWAY a client for its pings
]


def client_options(period_s: float, timeout_s: float) -> list[tuple[str, Any]]:
    """Channel options of the router's channels to workers: ping while calls are open, even while a
    stream sends no data (a long prefill), and fail the calls once a ping goes unanswered."""
    return [
        ("grpc.keepalive_time_ms", int(period_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout_s * 1000)),
        ("grpc.http2.ping_timeout_ms", int(timeout_s * 1000)),  # grpc core 1.85 times keepalive pings by this
        ("grpc.http2.max_pings_without_data", 0),  # no cap on pings while a stream is silent
        ("grpc.http2.min_time_between_pings_ms", int(period_s * 1000)),  # core's default: 5 minutes
        ("grpc.keepalive_permit_without_calls", 0),  # an idle channel needs no pings
    ]

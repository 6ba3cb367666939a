"""Range checks of a capacity report at the boundary, before anything else reads it.

A report is untrusted input: a negative queue length made placement divide by zero, a timestamp in the
future was never late, a negative token count skewed every score. Every field is checked here and a bad
report is refused whole (`Problem.field` names the first bad field; the router counts it by field), so
placement only ever sees values inside these bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from zipkv.protos import zipkv_pb2 as pb

MAX_TOKENS = 1 << 40  # far above any KV budget (a 1 TiB pool of 1-byte tokens)
MAX_REQUESTS = 1 << 20
MAX_MS = 3_600_000.0  # an hour: a latency above this is a broken clock, not a slow worker
MAX_KV_BYTES_PER_TOKEN = 1 << 30
MAX_ORDER = (1 << 63) - 1  # epoch and sequence are stored as signed 64-bit (Redis, JSON)
WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")


@dataclass(frozen=True, slots=True)
class Problem:
    field: str  # the first bad field (a metric label: one of the report's field names)
    message: str  # says what was wrong, sent back to the worker in ReportAck.reason
    outcome: str = "invalid"  # invalid | late | future


def _address_ok(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep) and bool(HOST.fullmatch(host)) and port.isdigit() and 0 < int(port) <= 65535


def _ranges(r: pb.CapacityReport) -> Problem | None:
    ints = (
        ("headroom_tokens", r.headroom_tokens, 0, MAX_TOKENS),
        ("committed_tokens", r.committed_tokens, 0, MAX_TOKENS),
        ("total_tokens", r.total_tokens, 0, MAX_TOKENS),
        ("running_requests", r.running_requests, 0, MAX_REQUESTS),
        ("queued_requests", r.queued_requests, 0, MAX_REQUESTS),
        ("queued_prefill_tokens", r.queued_prefill_tokens, 0, MAX_TOKENS),
        ("max_context_tokens", r.max_context_tokens, 0, (1 << 31) - 1),
        ("kv_bytes_per_token", r.kv_bytes_per_token, 0, MAX_KV_BYTES_PER_TOKEN),
        ("epoch", r.epoch, 0, MAX_ORDER),
        ("sequence", r.sequence, 1, MAX_ORDER),
    )
    for name, value, lo, hi in ints:
        if not lo <= value <= hi:
            return Problem(name, f"{name} must be within [{lo}, {hi}], got {value}")
    if r.headroom_tokens > r.total_tokens:
        return Problem(
            "headroom_tokens", f"headroom_tokens ({r.headroom_tokens}) > total_tokens ({r.total_tokens})"
        )
    floats = (
        ("compression_ratio", r.compression_ratio, 1.0),
        ("ttft_ms", r.ttft_ms, MAX_MS),
        ("itl_ms", r.itl_ms, MAX_MS),
    )
    for fname, x, top in floats:
        if not (math.isfinite(x) and 0.0 <= x <= top):
            return Problem(fname, f"{fname} must be a finite number within [0, {top:g}], got {x}")
    return None


def check_report(
    report: pb.CapacityReport, received_s: float, stale_after_ms: int, models: frozenset[str]
) -> Problem | None:
    """Why `report` must be refused (None when it may be applied). `received_s` is the router's clock;
    a report built more than `stale_after_ms` before it arrived is late, one built more than that after
    (the worker's clock runs ahead, or the timestamp is forged) is from the future."""
    r = report
    if not WORKER_ID.fullmatch(r.worker_id):
        return Problem("worker_id", f"worker_id must match {WORKER_ID.pattern}, got {r.worker_id[:140]!r}")
    if not _address_ok(r.address):
        got = r.address[:300]
        return Problem("address", f"address must be host:port with a port in 1..65535, got {got!r}")
    if r.model not in models:
        return Problem("model", f"model {r.model[:200]!r} is not served by this router ({sorted(models)})")
    problem = _ranges(r)
    if problem is not None:
        return problem
    if not math.isfinite(r.timestamp_s):
        return Problem("timestamp_s", f"timestamp_s must be finite, got {r.timestamp_s}")
    bound_s = stale_after_ms / 1000.0
    age_s = received_s - r.timestamp_s
    if age_s > bound_s:
        return Problem("timestamp_s", f"late: built {age_s:.3f} s before it arrived", "late")
    if -age_s > bound_s:
        return Problem(
            "timestamp_s",
            f"from the future: built {-age_s:.3f} s after it arrived (check the worker's clock, NTP)",
            "future",
        )
    return None

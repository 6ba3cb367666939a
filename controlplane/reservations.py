"""A router's reservations on a worker, and what they add to the worker's last report (controlplane/state.py's
module doc: the headroom rule and the prefill accounting). Pure functions of the reservations, a report's
receive time and the clock."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reservation:
    tokens: int
    started_s: float  # 0 until the first token arrived
    expires_s: float  # a router that died never releases; its reservations expire
    prefill_tokens: int | None = None  # prompt tokens the worker is expected to prefill (None: `tokens`)
    cached_tokens: int = 0  # prompt tokens expected from the worker's prefix cache
    placed_s: float = 0.0  # router clock at reserve (0: not known, never taken as listed by a report)

    @property
    def is_claim(self) -> bool:
        """A claim (placement/headroom_wait.py): its request still waits at the router, so no report lists
        it; marked by a placed time of CLAIM_PLACED_S."""
        return self.placed_s == CLAIM_PLACED_S


CLAIM_PLACED_S = -1.0  # the placed time a claim is stored with


def claimed_tokens(reservations: list[Reservation], now_s: float) -> int:
    """Tokens of the live claims among a worker's reservations."""
    return sum(r.tokens for r in reservations if r.is_claim and r.expires_s > now_s)


def unseen_reserved(
    reservations: list[Reservation], report_received_s: float, now_s: float, delay_bound_s: float
) -> int:
    return sum(
        r.tokens
        for r in reservations
        if r.expires_s > now_s and (r.started_s == 0 or report_received_s < r.started_s + delay_bound_s)
    )


def prefill_accounting(
    reservations: list[Reservation], report_received_s: float, now_s: float, delay_bound_s: float
) -> tuple[int, int]:
    """(unseen_prefill_tokens, listed_done_tokens) of a worker's reservations against its report
    (module doc, prefill accounting)."""
    unseen = listed_done = 0
    for r in reservations:
        if r.expires_s <= now_s:
            continue
        listed = r.placed_s > 0 and report_received_s >= r.placed_s + delay_bound_s
        if r.started_s == 0:
            if listed:
                listed_done += r.cached_tokens
            else:
                unseen += r.tokens if r.prefill_tokens is None else r.prefill_tokens
        elif listed and r.started_s > report_received_s and r.prefill_tokens is not None:
            listed_done += r.prefill_tokens + r.cached_tokens
    return unseen, listed_done

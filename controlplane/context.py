"""The context-length rule, in one place: what a model's context is at the router, and whether a request
fits a context.

The router refuses a request that no worker could hold (400, `context_length_exceeded`) and placement
drops the workers whose own context is too short; both ask here.
"""

from __future__ import annotations

from collections.abc import Iterable

from zipkv.controlplane.state import WorkerView


def fits_context(need_tokens: int, context_tokens: int) -> bool:
    """Whether ``need_tokens`` (prompt + new tokens) fit a context of ``context_tokens`` (0: not known,
    so no limit)."""
    return context_tokens <= 0 or need_tokens <= context_tokens


def model_context_tokens(model: str, configured_tokens: int, workers: Iterable[WorkerView]) -> int:
    """The model's context: the configured one, lowered to the largest that a live worker of it reports
    (a request that no worker could hold is malformed, not a capacity problem)."""
    reported = [
        v.capacity.max_context_tokens
        for v in workers
        if v.model == model and v.capacity.max_context_tokens > 0
    ]
    return min(configured_tokens, max(reported)) if reported else configured_tokens

"""The engine interface every worker engine implements (the reference engine, SGLang).

An engine is driven by one thread: `add_request` and `abort` queue work, `step` runs one scheduling
step (admission, prefill or decode, sampling) and returns what happened, `capacity` says how much more
it can take (zipkv.protos.capacity.Capacity: headroom in tokens; pages stay inside the engine).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from zipkv.protos.capacity import Capacity
from zipkv.worker.engine_stats import KVStats, RequestTimings


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token or EOS
    LENGTH = "length"  # max_new_tokens or the context limit
    ABORT = "abort"  # aborted by the caller or the worker draining
    ERROR = "error"


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int = 0  # 0 = engine default

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # W3C trace context (traceparent, tracestate) of the worker's span for this request, for an engine
    # that traces inside itself (SGLang's scheduler); empty when not traced
    trace_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineEvent:
    """New tokens of one request in one step, and its finish if it finished in that step."""

    request_id: str
    token_ids: tuple[int, ...] = ()
    finish: FinishReason | None = None
    message: str = ""  # detail for ABORT / ERROR
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    timings: RequestTimings | None = None  # on the finish event: where the request's time went


class RequestRejected(Exception):
    """The engine cannot take this request; `retryable` says whether another worker might."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@runtime_checkable
class Engine(Protocol):
    model_name: str

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises RequestRejected when it can never run here (or the queue is full)."""

    def abort(self, request_id: str) -> bool:
        """Abort a queued or running request; its ABORT event comes from the next `step`."""

    def step(self, on_scheduled: Callable[[], None] | None = None) -> list[EngineEvent]:
        """Run one scheduling step; returns new tokens and finishes. ``on_scheduled`` is called once the
        step's requests are admitted and before the model runs, so that a capacity read then counts the
        requests being prefilled (a long prompt's prefill is one step of seconds)."""

    def has_work(self) -> bool:
        """Whether `step` would do anything."""

    def capacity(self) -> Capacity:
        """Live capacity, for admission at the router."""

    def kv_stats(self) -> KVStats | None:
        """The KV pool's state and the encoder's counts, for the replica's metrics (None: not known)."""

"""A request whose worker was lost mid-generation, opened on another worker (never one that failed it).

- **Non-streamed** (`restart`): from scratch. Nobody has seen its text, so the client gets one whole reply
  and a seed keeps its promise.
- **Streamed** (`resume`): the client already has tokens, so the request goes on from them: its prompt is
  extended by the tokens sent so far and its max_tokens cut by as many, and the new worker's tokens follow
  in the same stream. The continuation samples the same distribution given the same prefix, but is not
  the text an uninterrupted run would have given. Not for seeded sampling (a seed promises the same text
  on a rerun, which a continuation cannot keep) and not with `dispatch.resume_streams` off.

How many times: `dispatch.mid_request_retries` (relay.py loops).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from opentelemetry import trace

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.dispatch import Dispatcher
from zipkv.controlplane.dispatch_request import Sampling
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.placement import RequestShape
from zipkv.controlplane.relay import Redispatch, Relay
from zipkv.controlplane.worker_rpc import DispatchError
from zipkv.controlplane.worker_stream import Stream

log = logging.getLogger("zipkv.controlplane.reopen")


class Reopener:
    def __init__(self, cfg: RouterConfig, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.cfg, self.dispatcher, self.metrics = cfg, dispatcher, metrics

    def restart(self, shape: RequestShape, ids: list[int], samp: Sampling, span: trace.Span) -> Redispatch:
        async def again(lost: frozenset[str]) -> Stream | None:
            return await self._open(shape, ids, samp, span, lost)

        return again

    def resume(self, shape: RequestShape, ids: list[int], samp: Sampling, relay: Relay) -> Redispatch | None:
        if not self.cfg.dispatch.resume_streams or (samp.seed is not None and samp.temperature > 0):
            return None

        async def again(lost: frozenset[str]) -> Stream | None:
            sent = relay.emitted_ids
            left = shape.max_new_tokens - len(sent)
            if left <= 0:
                return None
            rest = replace(shape, prompt_tokens=len(ids) + len(sent), max_new_tokens=left)
            return await self._open(rest, ids + sent, samp, relay.span, lost)

        return again

    async def _open(
        self, shape: RequestShape, ids: list[int], samp: Sampling, span: trace.Span, lost: frozenset[str]
    ) -> Stream | None:
        """Dispatch, avoiding the workers in `lost`; None when nobody takes it (the caller answers 502)."""
        self.metrics.retries.labels("lost_mid_request").inc()
        try:
            with trace.use_span(span, end_on_exit=False):
                return await self.dispatcher.start(shape, ids, samp, avoid=lost)
        except DispatchError as exc:
            log.info("no worker took the request again", extra={"reason": exc.reason})
            return None

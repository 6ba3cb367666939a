"""Turns a worker's token stream into an OpenAI response: SSE chunks or one JSON body.

Text is detokenised incrementally; stop strings are matched on the text (holding back just enough
characters to catch a stop string split across chunks) and end the worker's request early.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from opentelemetry import trace

from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.openai_api import ResponseShape, error_body
from zipkv.controlplane.stop_strings import StopMatcher
from zipkv.controlplane.tokenizer import IncrementalDetokenizer, Tokenizer
from zipkv.controlplane.worker_stream import Failed, Finished, Stream, Tokens


@dataclass
class Outcome:
    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    lost_worker: bool = False  # the error is the worker going away mid-stream (`Failed`), not its answer


# A request's second chance after a lost worker (reopen.py): given the workers that failed it, the request
# opened again on another one, or None when nobody takes it.
Redispatch = Callable[[frozenset[str]], Awaitable[Stream | None]]


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class Relay:
    """One request's relay; `pieces()` yields (text, finish_reason) and fills `outcome`."""

    def __init__(
        self,
        stream: Stream,
        tokenizer: Tokenizer,
        stops: list[str],
        prompt_tokens: int,
        metrics: RouterMetrics,
        model: str,
        t_in: float,
        span: trace.Span,
        slo_ms: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.stream, self.metrics, self.model, self.t_in, self.span = stream, metrics, model, t_in, span
        # The model's histogram children, looked up once: labels() takes a lock and builds a key on every
        # call, and the gap histogram is observed once per streamed token.
        self._ttft_ms, self._itl_ms = metrics.ttft_ms.labels(model), metrics.itl_ms.labels(model)
        self.slo_ttft_ms, self.slo_tpot_ms = slo_ms  # 0 = no target
        self._first_chunk_s = 0.0
        self._tokenizer = tokenizer
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(stops)
        self.outcome = Outcome(prompt_tokens=prompt_tokens)
        self._last_chunk_s = 0.0
        self._finished = False
        self._retried = False  # switched to another worker (switch_to)
        self.emitted_ids: list[int] = []  # every token id received so far (what a resumed stream follows)
        self._tokens_before = 0  # tokens from the workers before this one (a resumed stream)

    def _timing(self) -> None:
        now = time.perf_counter()
        if self._last_chunk_s == 0.0:
            self._first_chunk_s = now
            if not self._retried:
                self._ttft_ms.observe((now - self.t_in) * 1000.0)
        else:
            self._itl_ms.observe((now - self._last_chunk_s) * 1000.0)
        self._last_chunk_s = now

    async def pieces(self) -> AsyncIterator[str]:
        out = self.outcome
        async for ev in self.stream.events():
            if isinstance(ev, Tokens):
                self._timing()
                self.emitted_ids.extend(ev.token_ids)
                out.completion_tokens += len(ev.token_ids)
                text, stopped = self.stops.push(self.detok.push(ev.token_ids))
                if text:
                    out.text += text
                    yield text
                if stopped:
                    out.finish_reason = "stop"
                    return  # close() aborts the worker's request
            elif isinstance(ev, Finished):
                tail, stopped = self.stops.push(self.detok.flush())
                tail += "" if stopped else self.stops.flush()
                if tail:
                    out.text += tail
                    yield tail
                out.finish_reason = ev.reason
                if not self._tokens_before:  # a resumed worker's prompt held the earlier tokens too
                    out.prompt_tokens = ev.prompt_tokens or out.prompt_tokens
                if ev.completion_tokens:
                    out.completion_tokens = self._tokens_before + ev.completion_tokens
                if ev.reason == "error":
                    out.error = (
                        f"worker {self.stream.worker_id} failed the request: {ev.message or 'no detail'}"
                    )
                return
            elif isinstance(ev, Failed):
                out.error, out.lost_worker = ev.message, True
                return

    async def switch_to(self, stream: Stream, resume: bool) -> None:
        """Go on with `stream`, the request opened on another worker after its worker was lost; the old
        stream is closed (Abort, reservation released). ``resume``: the new worker continues from the tokens
        received so far (its prompt holds them), the client keeps what it has. Else it starts again from
        scratch: only for a response nobody has seen yet (non-streamed). TTFT is observed once, on the
        first worker."""
        lost = self.stream.worker_id
        await self.stream.close()
        self.stream = stream
        self.span.add_event(
            "zipkv.worker_lost",
            {"zipkv.worker.lost": lost, "zipkv.worker.next": stream.worker_id, "zipkv.resumed": resume,
             "zipkv.tokens_sent": len(self.emitted_ids)},
        )  # fmt: skip
        self.span.set_attribute("zipkv.worker.id", stream.worker_id)
        self._retried = True
        if resume:
            self._tokens_before = len(self.emitted_ids)
            self.outcome.error, self.outcome.lost_worker = None, False
            return
        self.detok = IncrementalDetokenizer(self._tokenizer)
        self.stops = StopMatcher(self.stops.stops)
        self.outcome = Outcome(prompt_tokens=self.outcome.prompt_tokens)
        self.emitted_ids = []
        self._first_chunk_s = self._last_chunk_s = 0.0

    async def finish(self, on_done: Callable[[], None]) -> None:
        """Release everything, once (shielded: runs even when the client went away and we were cancelled)."""
        if self._finished:
            return
        self._finished = True
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.close()
            finally:
                out = self.outcome
                self.metrics.e2e_ms.labels(self.model).observe((time.perf_counter() - self.t_in) * 1000.0)
                self.span.set_attribute("gen_ai.usage.input_tokens", out.prompt_tokens)
                self.span.set_attribute("gen_ai.usage.output_tokens", out.completion_tokens)
                self.span.set_attribute("gen_ai.response.finish_reasons", [out.finish_reason])
                if out.error:
                    self.span.set_status(trace.Status(trace.StatusCode.ERROR, out.error))
                self.metrics.slo_requests.labels(self.model, self.slo_outcome()).inc()
                self.span.end()
                on_done()

    def slo_outcome(self) -> str:
        """met | ttft_missed | tpot_missed | failed: the request against its SLOs (TTFT: HTTP in to the
        first chunk; TPOT: the mean gap between output tokens after the first)."""
        out = self.outcome
        if out.error or self._first_chunk_s == 0.0:
            return "failed"
        if self.slo_ttft_ms and (self._first_chunk_s - self.t_in) * 1000.0 > self.slo_ttft_ms:
            return "ttft_missed"
        if self.slo_tpot_ms and out.completion_tokens > 1:
            tpot_ms = (self._last_chunk_s - self._first_chunk_s) * 1000.0 / (out.completion_tokens - 1)
            if tpot_ms > self.slo_tpot_ms:
                return "tpot_missed"
        return "met"


class RelayResponse(StreamingResponse):
    """An SSE response that releases the request even when its body never starts (the client left
    before the headers went out, so the body generator's own `finally` never runs).

    The body streams in the request's own task, and one plain task waits for the client to go away and then
    cancels it. Starlette's StreamingResponse does the same under the ASGI spec uvicorn reports (2.3) with
    an anyio task group (a child task for the body, cancel scopes), which cost about 0.15 ms of router CPU
    per request (bench/router/bench_gateway.py); what happens on a disconnect is unchanged: the body
    stops, the relay finishes (the worker gets Abort, the reservation goes), the response ends quietly."""

    def __init__(
        self, relay: Relay, on_done: Callable[[], None], body: AsyncIterator[bytes], headers: dict[str, str]
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._relay, self._on_done = relay, on_done
        self._client_gone = self._sent = False

    async def _cancel_when_gone(self, receive: Any, task: asyncio.Task[Any]) -> None:
        """Cancel `task` (the body) once the client disconnects. uvicorn also answers http.disconnect once
        the response is complete; by then the body is sent and nothing is cancelled."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._sent:
            self._client_gone = True
            task.cancel()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(self._cancel_when_gone(receive, task))
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            # Our own cancellation (the client left) ends the response; any other one goes on.
            if not self._client_gone or task.uncancel() > 0:
                raise
        finally:
            self._sent = True  # no await since the body ended: the watcher cannot have cancelled after it
            watcher.cancel()
            await self._relay.finish(self._on_done)


async def _replaced(
    relay: Relay, lost: set[str], redispatch: Redispatch | None, retries: int, resume: bool
) -> bool:
    """After `relay.pieces()` ended: if its worker was lost and a retry is left, open the request on another
    worker (never one that failed it) and switch the relay to it; whether it did."""
    if not relay.outcome.lost_worker or redispatch is None or len(lost) >= retries:
        return False
    lost.add(relay.stream.worker_id)
    stream = await redispatch(frozenset(lost))
    if stream is None:
        return False
    await relay.switch_to(stream, resume)
    return True


async def stream_sse(
    relay: Relay,
    shape: ResponseShape,
    include_usage: bool,
    on_done: Callable[[], None],
    resume: Redispatch | None = None,
    retries: int = 0,
) -> AsyncIterator[bytes]:
    """The SSE body. A worker lost mid-stream is replaced up to `retries` times through `resume`, which
    opens the request again continuing from the tokens sent so far; else the stream ends with an error."""
    lost: set[str] = set()
    try:
        while True:
            async for text in relay.pieces():
                yield b"data: " + shape.delta_json(text) + b"\n\n"
            if not await _replaced(relay, lost, resume, retries, resume=True):
                break
        out = relay.outcome
        if out.error:
            relay.metrics.rejections.labels("worker_failed").inc()
            yield sse(
                error_body(out.error + "; the response is incomplete, retry the request", "server_error", 502)
            )
            return
        yield sse(shape.chunk("", out.finish_reason))
        if include_usage:
            yield sse(shape.usage_chunk(out.prompt_tokens, out.completion_tokens))
        yield b"data: [DONE]\n\n"
    finally:
        await relay.finish(on_done)


async def collect(
    relay: Relay, on_done: Callable[[], None], redispatch: Redispatch | None = None, retries: int = 0
) -> Outcome:
    """A non-streamed response, whole. A worker lost mid-generation is replaced up to `retries` times
    through `redispatch` (the client has seen nothing, so the request starts again on another worker)."""
    lost: set[str] = set()
    try:
        while True:
            async for _ in relay.pieces():
                pass
            if not await _replaced(relay, lost, redispatch, retries, resume=False):
                break
    finally:
        await relay.finish(on_done)
    return relay.outcome

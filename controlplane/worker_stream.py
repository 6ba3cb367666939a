"""One dispatched request's token stream from its worker, as events: tokens, the finish, or a failure.

The stream tells its owner (the dispatcher) what happened; the owner keeps the reservation, the metrics
and the worker's Abort.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from zipkv.protos import zipkv_pb2 as pb

FINISH_NAMES = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
    pb.FINISH_REASON_ERROR: "error",
    pb.FINISH_REASON_UNSPECIFIED: "stop",
}


@dataclass(frozen=True, slots=True)
class Tokens:
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str  # stop | length | abort | error
    prompt_tokens: int
    completion_tokens: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class Failed:
    message: str  # the worker went away mid-stream


Event = Tokens | Finished | Failed


class StreamOwner(Protocol):
    """What a stream reports to, and asks of, whoever dispatched it."""

    def stream_failed(self) -> None: ...

    def first_token(self, worker_id: str, request_id: str) -> None: ...

    async def abort(self, address: str, request_id: str) -> None: ...

    async def release(self, worker_id: str, request_id: str) -> None: ...


class Stream:
    """One dispatched request: the first event is already in hand."""

    def __init__(
        self,
        d: StreamOwner,
        call: grpc.aio.UnaryStreamCall,
        first: pb.GenerateResponse,
        worker_id: str,
        address: str,
        request_id: str,
    ) -> None:
        self._d, self._call, self._first = d, call, first
        self.worker_id, self.address, self.request_id = worker_id, address, request_id
        self.finished = False
        self._closed = False

    async def events(self) -> AsyncIterator[Event]:
        resp: Any = self._first
        started = False
        while True:
            if resp is None:
                try:
                    got = await self._call.read()
                except grpc.aio.AioRpcError as exc:
                    # Not `finished`: after a deadline the worker may still be generating; close()
                    # sends Abort (a dead worker just fails it fast).
                    self._d.stream_failed()
                    yield Failed(
                        f"worker {self.worker_id} failed mid-stream: {exc.code().name}: {exc.details()}"
                    )
                    return
                if got is grpc.aio.EOF:  # type: ignore[attr-defined]
                    self.finished = True
                    yield Failed(f"worker {self.worker_id} closed the stream without a finish event")
                    return
                resp = got  # type: ignore[assignment]
            assert resp is not None
            if resp.HasField("chunk"):
                if not started:
                    started = True
                    self._d.first_token(self.worker_id, self.request_id)
                yield Tokens(tuple(resp.chunk.token_ids))
            else:
                f = resp.finish
                self.finished = True
                yield Finished(
                    FINISH_NAMES.get(f.reason, "stop"),
                    f.usage.prompt_tokens,
                    f.usage.completion_tokens,
                    f.message,
                )
                return
            resp = None

    async def close(self) -> None:
        """Abort the worker's request if it is still running, then release the reservation (always)."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.finished:
                self._call.cancel()
                await self._d.abort(self.address, self.request_id)
        finally:
            await self._d.release(self.worker_id, self.request_id)

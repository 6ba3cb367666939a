"""One call to a worker, as dispatch sees it: which gRPC errors are retried elsewhere, which are the
caller's, waiting for a channel, and the HTTP error a failed call becomes."""

from __future__ import annotations

import asyncio
import time

import grpc

RETRYABLE = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
# The worker refused the request itself (ids outside its vocabulary, an empty prompt): the client's
# fault, answered 400 with the worker's own message; another worker would refuse it too.
CALLER_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}


class DispatchError(Exception):
    """A request that cannot be served; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.retry_after_s = status, reason, message, retry_after_s


async def connect(channel: grpc.aio.Channel, address: str, timeout_s: float) -> None:
    """Wait until the channel is READY; fail at once on a refused connection, else after timeout_s."""
    state = channel.get_state(try_to_connect=True)
    deadline = time.monotonic() + timeout_s
    while state != grpc.ChannelConnectivity.READY:
        if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            raise unreachable(address)
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), deadline - time.monotonic())
        except TimeoutError:
            raise unreachable(address) from None
        state = channel.get_state(try_to_connect=True)


def unreachable(address: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details=f"worker {address} unreachable",
        debug_error_string="",
    )


def final_error(worker_id: str, exc: grpc.aio.AioRpcError) -> DispatchError:
    """What the caller gets when a worker's error is not worth a retry elsewhere: its own bad request (400),
    or the worker's failure (502; 504 past the deadline)."""
    if exc.code() in CALLER_ERRORS:
        return DispatchError(
            400, "worker_invalid_argument", f"the worker refused the request: {exc.details()}"
        )
    timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return DispatchError(
        504 if timed_out else 502,
        "worker_timeout" if timed_out else "worker_error",
        f"worker {worker_id} failed: {exc.code().name}: {exc.details()}",
    )

"""The engine loop: one thread owns the engine and steps it; asyncio callers submit and stream.

The engine is not thread-safe and its steps are CPU/GPU bound, so it lives on a dedicated thread. Callers
on an asyncio loop (the gRPC server) submit requests through an inbox and receive each request's events
on an `asyncio.Queue`, delivered with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass

from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import Engine, EngineEvent, EngineRequest, FinishReason
from zipkv.worker.engine_stats import KVStats

log = logging.getLogger("zipkv.worker")
KV_STATS_EVERY_S = 0.25  # the KV pool's stats (for /metrics) are read on the engine thread this often


@dataclass(frozen=True)
class _Submit:
    request: EngineRequest
    events: asyncio.Queue[EngineEvent]
    accepted: concurrent.futures.Future[None]


@dataclass(frozen=True)
class _Abort:
    request_id: str
    message: str


# Put into each held stream's queue once the engine has stalled (`stall_after_s`): the call holding it fails
# with UNAVAILABLE (service.py), so that its router moves the request now.
STALLED = EngineEvent("", message="engine stalled")


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        idle_wait_s: float = 0.02,
        stall_after_s: float = 0.0,
    ) -> None:
        """``stall_after_s``: requests in the engine and no event (token, finish) for this long make the
        loop not `alive` (0 = never)."""
        self.engine = engine
        self.stall_after_s = stall_after_s
        # monotonic time of the last event delivered, or of the work starting (None: no work)
        self._progress_s: float | None = None
        self._loop = loop
        self._inbox: queue.Queue[_Submit | _Abort] = queue.Queue()
        self._streams: dict[str, asyncio.Queue[EngineEvent]] = {}
        self._abort_messages: dict[str, str] = {}
        self._idle_wait_s = idle_wait_s
        self._stop = threading.Event()
        self._capacity = engine.capacity()
        self._kv_stats = engine.kv_stats()
        self._kv_stats_s = time.monotonic()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="zipkv-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None and self.stalled_s() == 0.0

    def trouble(self) -> str:
        """Why the loop is not `alive`, in words ('' while it is)."""
        if self.error is not None:
            return f"engine failed: {self.error}"
        if stalled := self.stalled_s():
            return f"engine stuck: no token for {stalled:.0f} s (engine_stall_s {self.stall_after_s:g})"
        return "" if self._thread.is_alive() else "engine loop stopped"

    def silent_s(self) -> float:
        """How long the engine has held requests without an event (a token, a finish); 0 while idle."""
        since = self._progress_s
        return 0.0 if since is None else time.monotonic() - since

    def stalled_s(self) -> float:
        """`silent_s`, once past ``stall_after_s`` (else 0). A hung GPU (a kernel or a collective that never
        completes) keeps this thread alive and every stream silent, whether the step blocks (the reference
        engine) or returns empty (SGLang's scheduler runs in its own process): this is how the replica's
        health check, its reports and its Generate see it."""
        silent = self.silent_s()
        return silent if self.stall_after_s and silent > self.stall_after_s else 0.0

    # ---- asyncio side -------------------------------------------------------------------------------
    async def watch_stall(self) -> None:
        """Runs on the asyncio loop until stopped: once the engine has stalled, each held stream gets STALLED
        once. One watcher for all streams, so that a token's way to its caller stays one queue get."""
        if not self.stall_after_s:
            return
        told: set[str] = set()
        while not self._stop.is_set():
            await asyncio.sleep(min(1.0, max(0.05, self.stall_after_s / 4)))
            if not self.stalled_s():
                told.clear()
                continue
            for request_id, stream in list(self._streams.items()):
                if request_id not in told:
                    told.add(request_id)
                    stream.put_nowait(STALLED)

    async def submit(self, request: EngineRequest) -> asyncio.Queue[EngineEvent]:
        """Queue a request; raises the engine's RequestRejected if it refuses it."""
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        accepted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._inbox.put(_Submit(request, events, accepted))
        await asyncio.wrap_future(accepted)
        return events

    def abort(self, request_id: str, message: str = "aborted") -> None:
        self._inbox.put(_Abort(request_id, message))

    def capacity(self) -> Capacity:
        return self._capacity

    def kv_stats(self) -> KVStats | None:
        """The KV pool's state as of the last snapshot (at most KV_STATS_EVERY_S old while running)."""
        return self._kv_stats

    def has_stream(self, request_id: str) -> bool:
        return request_id in self._streams

    def stream_ids(self) -> list[str]:
        return list(self._streams)

    def inflight(self) -> int:
        return len(self._streams)

    # ---- engine thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Published whenever the engine's load changes: requests it took (queued) and, inside the
                # step, those admitted for prefill, so reports count them before their first token.
                if self._drain_inbox(block=not self.engine.has_work()):
                    self._publish_capacity()
                if self.engine.has_work():
                    self._progress_s = self._progress_s or time.monotonic()
                    events = self.engine.step(on_scheduled=self._publish_capacity)
                    if events:
                        self._progress_s = time.monotonic()
                    self._deliver(events)
                else:
                    self._progress_s = None
                self._publish_capacity()
                if time.monotonic() - self._kv_stats_s >= KV_STATS_EVERY_S:
                    self._kv_stats, self._kv_stats_s = self.engine.kv_stats(), time.monotonic()
        except BaseException as exc:  # the replica is unhealthy from here on: fail every stream clearly
            self.error = exc
            log.exception("engine loop failed: %s", exc)
            for rid in list(self._streams):
                self._deliver([EngineEvent(rid, finish=FinishReason.ERROR, message=f"engine failed: {exc}")])

    def _publish_capacity(self) -> None:
        self._capacity = self.engine.capacity()  # one reference swap: readers on other threads see old or new

    def _drain_inbox(self, block: bool) -> bool:
        """Take what was submitted (requests, aborts); whether there was anything."""
        try:
            item = self._inbox.get(timeout=self._idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            if isinstance(item, _Submit):
                self._add(item)
            elif self.engine.abort(item.request_id):
                self._abort_messages[item.request_id] = item.message
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, item: _Submit) -> None:
        try:
            self.engine.add_request(item.request)
        except BaseException as exc:
            self._loop.call_soon_threadsafe(_set_exception, item.accepted, exc)
            return
        self._streams[item.request.request_id] = item.events
        self._loop.call_soon_threadsafe(_set_result, item.accepted)

    def _deliver(self, events: list[EngineEvent]) -> None:
        for event in events:
            stream = self._streams.get(event.request_id)
            if stream is None:
                continue
            if event.finish is not None:
                del self._streams[event.request_id]
                message = self._abort_messages.pop(event.request_id, None)
                if message and event.finish is FinishReason.ABORT:
                    event = EngineEvent(**{**event.__dict__, "message": message})
            self._loop.call_soon_threadsafe(stream.put_nowait, event)


def _set_result(fut: concurrent.futures.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_exception(fut: concurrent.futures.Future[None], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def wait_until(predicate: object, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll ``predicate()`` until true or the timeout; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(poll_s)
    return bool(predicate())  # type: ignore[operator]

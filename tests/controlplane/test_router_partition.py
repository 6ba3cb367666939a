"""A worker cut off by the network (no reset, no close: packets just stop), through a TCP proxy that starts
dropping every byte both ways, in front of a scripted worker (a stand-in for a GPU worker), over real gRPC.

Without keepalive the router would wait for the Generate deadline (600 s by default); with the router's
pings (`dispatch.keepalive_s`, `keepalive_timeout_s`) the stream fails within about a second here: a
streamed request ends with an error event, a non-streamed one is answered by another worker.

A slow link (the same proxy delaying every byte) loses nothing while its round trip stays under
`keepalive_timeout_s`; past it the pings' answers come too late and the worker is judged lost, which is why
the timeout must exceed the worst round trip between router and workers (docs/router.md).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from router_harness import MODEL, Stack, stack

from zipkv.testing.scripted_worker import Script, ScriptedWorker

FAST_KEEPALIVE = {"keepalive_s": 0.5, "keepalive_timeout_s": 0.5}


class PartitionProxy:
    """Forwards TCP to a worker, each chunk `delay_s` late (in order), until `cut()`; from then on reads and
    drops every byte, closing nothing."""

    def __init__(self, target: str, delay_s: float = 0.0) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.delay_s = delay_s
        self.cut_off = False
        self.address = ""

    async def start(self) -> str:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self.address

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        worker_r, worker_w = await asyncio.open_connection(self.host, self.port)
        await asyncio.gather(self._pump(client_r, worker_w), self._pump(worker_r, client_w))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._deliver(queue, dst))
        while data := await src.read(65536):
            if not self.cut_off:
                queue.put_nowait((time.monotonic() + self.delay_s, data))
        queue.put_nowait(None)
        await sender

    @staticmethod
    async def _deliver(queue: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter) -> None:
        while (item := await queue.get()) is not None:
            due_s, data = item
            await asyncio.sleep(max(0.0, due_s - time.monotonic()))
            dst.write(data)
            await dst.drain()

    def cut(self) -> None:
        self.cut_off = True

    def slow_down(self, delay_s: float) -> None:
        self.delay_s = delay_s


def behind_proxy(
    s: Stack, script: Script, total_tokens: int, delay_s: float = 0.0
) -> tuple[ScriptedWorker, PartitionProxy]:
    """A worker whose report names the proxy's address, so that the router dials it through the proxy."""
    worker = s.add_worker(script, report=False, total_tokens=total_tokens)
    proxy = PartitionProxy(worker.address, delay_s)
    s.loop.run(proxy.start())
    assert s.report(worker, address=proxy.address).accepted
    return worker, proxy


def stream_until_fault(
    s: Stack, fault: Callable[[], None], read_timeout_s: float, max_tokens: int = 400
) -> tuple[list[str], float]:
    """A streamed request; `fault` is done to its link after its second event. Its events and the seconds
    from the fault to the stream's end."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream": True}
    events: list[str] = []
    timeout = httpx.Timeout(10.0, read=read_timeout_s)
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=timeout) as r:
        for line in r.iter_lines():
            if line:
                events.append(line)
            if len(events) == 2:
                fault()
                fault_at = time.monotonic()
    return events, time.monotonic() - fault_at


def test_a_stream_on_a_partitioned_worker_ends_with_an_error_within_the_keepalive() -> None:
    with stack(dispatch=FAST_KEEPALIVE) as s:
        _, proxy = behind_proxy(s, Script(itl_s=0.05), 100_000)
        events, after_cut_s = stream_until_fault(s, proxy.cut, read_timeout_s=10.0)
        assert '"error"' in events[-1] and "failed mid-stream: UNAVAILABLE" in events[-1], events[-1]
        assert after_cut_s < 4.0, after_cut_s  # one missed ping: 0.5 s period + 0.5 s timeout, plus slack
        assert len(events) < 50  # nothing after the cut got through


def test_without_a_ping_soon_the_stream_just_hangs() -> None:
    """The control: with a 60 s ping period the same cut leaves the client waiting."""
    with stack(dispatch={"keepalive_s": 60.0}) as s:
        _, proxy = behind_proxy(s, Script(itl_s=0.05), 100_000)
        with pytest.raises(httpx.ReadTimeout):
            stream_until_fault(s, proxy.cut, read_timeout_s=3.0)


def test_a_non_streamed_request_on_a_partitioned_worker_is_answered_by_another() -> None:
    with stack(dispatch=FAST_KEEPALIVE) as s:
        cut_worker, proxy = behind_proxy(s, Script(itl_s=0.05), 200_000)  # most headroom: first
        good = s.add_worker(total_tokens=100_000)
        threading.Timer(0.5, proxy.cut).start()  # ~10 of its 40 tokens generated by then
        t0 = time.monotonic()
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 40})
        assert r.status_code == 200, r.text
        assert r.headers["x-zipkv-worker"] == good.worker_id
        assert r.json()["usage"]["completion_tokens"] == 40
        assert len(cut_worker.seen.requests) == 1 and len(good.seen.requests) == 1
        assert time.monotonic() - t0 < 5.0


def test_a_silent_stream_survives_the_pings() -> None:
    """A long prefill sends nothing for seconds while the router pings: the worker's server accepts the
    pings (grpc_keepalive.SERVER_OPTIONS). With gRPC's default policy the server counts a strike for every
    ping within 5 minutes of the last and answers the third with GOAWAY (too_many_pings): ~5.6 s here."""
    with stack(dispatch=FAST_KEEPALIVE) as s:
        s.add_worker(Script(ttft_s=7.0))
        body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30.0)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "hell"


def stream_whole(s: Stack, max_tokens: int) -> tuple[list[str], float]:
    """A streamed request's events and the seconds to its first one."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream": True}
    events: list[str] = []
    t0 = time.monotonic()
    first_s = 0.0
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=20.0) as r:
        for line in r.iter_lines():
            if line and not events:
                first_s = time.monotonic() - t0
            if line:
                events.append(line)
    return events, first_s


def test_a_slow_link_delays_the_reply_and_loses_nothing() -> None:
    """300 ms each way (a 600 ms round trip) under pings every 0.5 s with a 1.5 s timeout."""
    with stack(dispatch={"keepalive_s": 0.5, "keepalive_timeout_s": 1.5}) as s:
        worker, _ = behind_proxy(s, Script(itl_s=0.1), 100_000, delay_s=0.3)
        events, first_s = stream_whole(s, 20)  # 2 s of tokens: several pings answered over the slow link
        assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events), events[-3:]
        assert '"finish_reason":"length"' in events[-2].replace(" ", ""), events[-2]
        assert first_s >= 0.6  # the request's way there and the first token's way back
        body = {"model": MODEL, "prompt": "x", "max_tokens": 8}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=20.0)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
        assert len(worker.seen.requests) == 2  # each dispatched once: no ping went unanswered


def test_a_round_trip_past_the_keepalive_timeout_is_judged_lost() -> None:
    """The link turns slow mid-stream, 800 ms each way, pings timing out after 0.5 s: it is slow, not cut,
    but the router cannot tell, so the stream fails as a lost worker's does. (A link that slow from the
    start fails the connect instead: the client gets a 503 with Retry-After.)"""
    with stack(dispatch={"keepalive_s": 0.5, "keepalive_timeout_s": 0.5}) as s:
        _, proxy = behind_proxy(s, Script(itl_s=0.1), 100_000)
        events, _ = stream_until_fault(s, lambda: proxy.slow_down(0.8), read_timeout_s=20.0, max_tokens=60)
        assert '"error"' in events[-1] and "UNAVAILABLE" in events[-1], events[-1]
        assert len(events) < 40  # failed well before the 60 tokens' 6 s

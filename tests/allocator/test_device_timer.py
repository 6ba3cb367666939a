"""DeviceTimer (allocator/device_timer.py) with scripted events: a span's device time counts once its end
event has completed, in launch order, never waited for; capture and the CPU record nothing; and the pool
wraps its encode and move launches in spans and reports them with its end_step host time."""

from __future__ import annotations

from typing import Any

import pytest
from pool_harness import Harness, make_pool

from zipkv.allocator import device_timer
from zipkv.allocator.device_timer import DeviceTimer


class FakeClock:
    """Events stamped by a clock the test moves; an event has completed once `done_up_to` reaches it."""

    def __init__(self) -> None:
        self.now_ms, self.done_up_to, self.made = 0.0, -1.0, 0

    def event(self) -> Any:
        clock = self
        clock.made += 1

        class Event:
            at = -1.0

            def record(self) -> None:
                self.at = clock.now_ms

            def query(self) -> bool:
                return 0 <= self.at <= clock.done_up_to

            def elapsed_time(self, end: Any) -> float:
                return float(end.at - self.at)

        return Event()


def test_spans_count_once_completed_in_launch_order_and_take_resets() -> None:
    clock = FakeClock()
    timer = DeviceTimer(True, clock.event, lambda: False)
    for length in (2.0, 3.0, 5.0):
        with timer.span():
            clock.now_ms += length  # the device work the span launched ends `length` ms later
    # Only the first two have completed: the third's time waits for the next take, nothing blocks
    clock.done_up_to = 5.0
    assert timer.take() == (5.0, 2)
    assert timer.take() == (0.0, 0)
    clock.done_up_to = 100.0
    assert timer.take() == (5.0, 1)


def test_completed_spans_are_taken_in_at_each_new_span_so_only_those_in_flight_are_held() -> None:
    clock = FakeClock()
    timer = DeviceTimer(True, clock.event, lambda: False, max_pending=2, keep_spans=True)
    for _ in range(10):  # a device that keeps up: each span has completed by the next launch
        with timer.span():
            clock.now_ms += 1.0
        clock.done_up_to = clock.now_ms
    assert timer.dropped == 0  # never more than one in flight, although 10 > max_pending
    assert timer.completed_ms() == [1.0] * 10 and timer.take() == (10.0, 10)
    assert timer.completed_ms() == [] and timer.take() == (0.0, 0)
    with pytest.raises(RuntimeError, match="keep_spans"):
        DeviceTimer(True, clock.event, lambda: False).completed_ms()


def test_capture_and_the_cpu_record_nothing() -> None:
    clock = FakeClock()
    for timer in (
        DeviceTimer(True, clock.event, lambda: True),
        DeviceTimer(False, clock.event, lambda: False),
    ):
        with timer.span():
            clock.now_ms += 1.0
        clock.done_up_to = 10.0
        assert timer.take() == (0.0, 0)
    assert clock.made == 0  # no event was even created


def test_pending_spans_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(device_timer, "MAX_PENDING", 3)
    clock = FakeClock()
    timer = DeviceTimer(True, clock.event, lambda: False)  # the default bound (MAX_PENDING)
    for _ in range(5):
        with timer.span():
            clock.now_ms += 1.0
    clock.done_up_to = 100.0
    assert timer.dropped == 2 and timer.take() == (3.0, 3)  # the oldest two dropped, the rest counted
    own = DeviceTimer(True, clock.event, lambda: False, max_pending=1, keep_spans=True)  # a bound of its own
    clock.done_up_to = -1.0  # a device that falls behind
    for _ in range(3):
        with own.span():
            clock.now_ms += 2.0
    clock.done_up_to = 100.0
    assert own.dropped == 2 and own.completed_ms() == [2.0]  # the newest one of three in flight


def test_the_pool_times_its_encode_and_move_launches_and_its_end_step() -> None:
    h = Harness(make_pool(layers=2, chunks=40, compaction_interval_steps=10**6))
    clock = FakeClock()
    for name in ("encode", "move"):
        h.pool.device_timers[name] = DeviceTimer(True, clock.event, lambda: False)
    for i in range(8):
        h.admit(96 if i % 2 else 48, "smooth")
    for _ in range(4):
        h.step(12)  # pages fill (encode launches) and the short requests leave holes
    assert h.pool.compact() > 0  # one move launch
    clock.done_up_to = 0.0  # the fake device ran every span in zero time: counted, 0 ms
    t = h.pool.take_timings()
    assert t["encode_spans"] >= 1 and t["move_spans"] == 1 and t["restore_spans"] == 0
    assert t["encode_gpu_ms"] == 0.0 and t["end_step_host_ms"] > 0.0
    again = h.pool.take_timings()
    assert again["encode_spans"] == 0 and again["move_spans"] == 0 and again["end_step_host_ms"] == 0.0

"""The replica fault drill's judgement (bench/serving/replica_faults.py): which client outcomes pass (a whole
reply, or an error the client is told of) and which fail (a hang, a short reply passed off as whole), from
the SSE lines the router really sends; the /proc walk that finds the engine's processes to stop; and the wait
for both requests to run before the fault (bench/serving/replica_faults_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench.serving.replica_faults import _read_event, child_pids, classify
from bench.serving.replica_faults_gpu import _wait_both_running

MAX = 8


def stream_outcome(lines: list[str]) -> dict[str, object]:
    out: dict[str, object] = {"events": 0, "error_event": None, "finish_reason": None, "usage_tokens": None,
                              "done_marker": False, "status": 200}  # fmt: skip
    for line in lines:
        _read_event(line, out)
    return out


def data(event: dict[str, object]) -> str:
    return "data: " + json.dumps(event)


TEXT = data({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
END = data({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
SHORT = data({"choices": [], "usage": {"completion_tokens": MAX - 1}})
USAGE = data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": MAX, "total_tokens": 11}})
ERROR = data({"error": {"message": "worker w failed mid-stream", "type": "server_error", "code": 502}})


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([TEXT, END, USAGE, "data: [DONE]"], "whole"),
        ([TEXT, ERROR, "data: [DONE]"], "clean_error"),
        ([TEXT, ERROR], "clean_error"),
        ([TEXT, TEXT], "truncated"),  # the connection just ended
        ([TEXT, END, "data: [DONE]"], "truncated"),  # no usage: the token count is unproven
        ([TEXT, END, SHORT, "data: [DONE]"], "truncated"),
    ],
)
def test_streams_pass_whole_or_with_an_error_event(lines: list[str], expected: str) -> None:
    assert classify(stream_outcome(lines), MAX, streamed=True) == expected


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ({"status": 200, "completion_tokens": MAX}, "whole"),
        ({"status": 200, "completion_tokens": MAX - 3}, "truncated"),
        ({"status": 502, "body": "{}"}, "clean_error"),
        ({"transport_error": "ReadTimeout: timed out"}, "hung"),
        ({"transport_error": "RemoteProtocolError: peer closed connection"}, "transport_error"),
    ],
)
def test_non_streamed_outcomes(outcome: dict[str, object], expected: str) -> None:
    assert classify(outcome, MAX, streamed=False) == expected


def test_child_pids_finds_this_process_children_only() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in child_pids(os.getpid())
        assert child.pid not in child_pids(child.pid) and child_pids(child.pid) == []
    finally:
        child.kill()
        child.wait()


class _Reports:
    """Stands in for the live stack's worker list (what the router's status reports), one entry a call."""

    def __init__(self, running: list[int]) -> None:
        self.running = running

    def workers(self) -> list[dict[str, int]]:
        value = self.running.pop(0) if len(self.running) > 1 else self.running[0]
        return [{"running_requests": value}]


def test_the_fault_waits_until_both_requests_run() -> None:
    assert _wait_both_running(_Reports([0, 1, 1, 2]), timeout_s=30) == [2]  # type: ignore[arg-type]


def test_a_drill_with_one_request_running_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert _wait_both_running(_Reports([1]), timeout_s=0.3) == [1]  # type: ignore[arg-type]
    assert "raise --kv-budget-mib" in capsys.readouterr().out

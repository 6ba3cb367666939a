"""OwnerThread keeps processes armed with PR_SET_PDEATHSIG alive until closed (real Linux signals)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import time

import pytest

from zipkv.worker.engines.sglang.owner_thread import OwnerThread

# What SGLang's scheduler does at start (sglang.srt.utils.kill_itself_when_parent_died), then waits.
_ARMED_CHILD = (
    "import ctypes, signal, time\n"
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\n"
    "print('armed', flush=True)\n"
    "time.sleep(60)\n"
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _start_armed_child() -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", _ARMED_CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "armed"
    return child


def test_a_helper_thread_that_returns_kills_its_armed_child() -> None:
    # The hazard itself: why a short-lived helper thread cannot build sglang.Engine.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        child = pool.submit(_start_armed_child).result()
    assert child.wait(timeout=10) == -9


def test_owner_thread_keeps_its_armed_child_until_closed() -> None:
    owner = OwnerThread("test-owner")
    child = owner.call(_start_armed_child)
    time.sleep(0.5)
    assert child.poll() is None, "the child died while its owner thread was alive"
    owner.close()
    assert child.wait(timeout=10) == -9


def test_owner_thread_runs_outside_the_callers_running_loop_and_raises_its_errors() -> None:
    owner = OwnerThread("test-owner")

    def running_loop() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    async def constructor() -> asyncio.AbstractEventLoop | None:  # Ray Serve calls __init__ like this
        assert running_loop() is not None
        return owner.call(running_loop)

    assert asyncio.run(constructor()) is None
    with pytest.raises(ValueError, match="bad config"):
        owner.call(lambda: (_ for _ in ()).throw(ValueError("bad config")))
    assert owner.call(lambda: 7) == 7  # still serving after an error
    owner.close()
    with pytest.raises(RuntimeError, match="closed"):
        owner.call(lambda: 1)

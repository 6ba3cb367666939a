"""`OwnerThread`: a thread that lives as long as the processes it starts.

SGLang's scheduler and detokenizer processes arm ``PR_SET_PDEATHSIG(SIGKILL)``
(``sglang.srt.utils.kill_itself_when_parent_died``). Linux sends that signal when the *thread* that forked
them exits, not when the process does. ``sglang.Engine`` built on a short-lived helper thread (as a Ray Serve
replica's constructor needs: Serve runs it inside a running event loop, which ``sglang.Engine`` would adopt)
therefore loses its scheduler the moment the helper returns: SIGKILL, exit code -9, seen on the H200. The
engine is built on an `OwnerThread` instead, which stays until the engine is shut down.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_CLOSE = object()


class OwnerThread:
    """Runs callables one at a time on one long-lived daemon thread, until `close`."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the owner thread; its exception, if any, is raised here."""
        if not self._thread.is_alive():
            raise RuntimeError(f"owner thread {self._thread.name} is closed; build a new engine")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, done))
        return done.result()

    def close(self, timeout_s: float = 30.0) -> None:
        """Let the thread end (processes it started and armed with PDEATHSIG then get their signal)."""
        if self._thread.is_alive():
            self._jobs.put(_CLOSE)
            self._thread.join(timeout_s)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not _CLOSE:
            fn, done = job
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller; the thread keeps serving
                done.set_exception(exc)

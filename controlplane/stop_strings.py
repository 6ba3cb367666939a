"""Stop strings on streamed text: a match ends the reply there, and a stop string split across chunks is
still caught (the tail that could begin one is held back until the next chunk or the end)."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._keep = max((len(s) for s in stops), default=1) - 1
        self._pending = ""

    def push(self, delta: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was hit)."""
        buf = self._pending + delta
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._pending = ""
            return buf[: min(hits)], True
        cut = max(len(buf) - self._keep, 0)
        self._pending = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

"""SGLang's admission latch, made aware that compression frees memory.

SGLang's scheduler stops trying new prefills once an attempt finds no room: it sets
``running_batch.batch_is_full`` and clears it only when a running request finishes (or the batch empties).
That is right for an uncompressed pool, where memory only comes back with finished requests. zipkv's pool
also gains room one step after a prefill, when the new pages are compressed; with the latch left set,
the room sits unused until the first request ends (seen on the H200: admission stopped at 51 running
requests with room for about six more, and 13 waiting, for the whole decode phase).

:class:`AdmissionLatch` releases the latch when the pool's live ``available_size()`` has grown since the
last time the latch was seen set; SGLang then runs its own admission check again (and sets the latch again
if the request still does not fit). Pure bookkeeping over duck-typed objects; seams.py installs it
around ``Scheduler.get_new_batch_prefill``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class AdmissionLatch:
    """Free tokens the pool had when SGLang's ``batch_is_full`` latch was last seen set (None: not set)."""

    seen_headroom_tokens: int | None = None

    def release(self, running_batch: Any, allocator: Any) -> bool:
        """Clear ``running_batch.batch_is_full`` if the pool has more room than when it was last seen set.

        Returns whether it cleared it. Called once per scheduler pass, before SGLang decides on a prefill.
        """
        if not running_batch.batch_is_full:
            self.seen_headroom_tokens = None
            return False
        headroom_tokens = int(allocator.available_size())
        grew = self.seen_headroom_tokens is not None and headroom_tokens > self.seen_headroom_tokens
        if grew:
            running_batch.batch_is_full = False
            self.seen_headroom_tokens = None
        else:
            self.seen_headroom_tokens = headroom_tokens
        return grew

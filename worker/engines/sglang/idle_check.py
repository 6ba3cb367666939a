"""SGLang's idle memory check, in zipkv's units.

SGLang checks at every idle step that ``available_size() + evictable + protected + session_held`` equals its
pool's size, and raises if not. With compression ``available_size()`` counts new raw pages that fit a byte
budget, so that sum means nothing; the invariant that does is about page ids: every page id SGLang holds
is owned by the prefix cache or a request, and the PagePool holds exactly those pages plus the padding
page. seams.py routes SGLang's check here for zipkv's allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zipkv.kernels.format.layout import PAGE_TOKENS

if TYPE_CHECKING:  # the allocator imports torch; SGLang's scheduler has it loaded by the time this runs
    from zipkv.worker.engines.sglang.allocator import ZipkvAllocator


def idle_check(
    alloc: ZipkvAllocator, evictable: int, protected: int, session_held: int, uncached: int
) -> tuple[bool, str]:
    """(leak, message), as SGLang's check returns them, for an idle scheduler's counts."""
    held = alloc.held_tokens()  # every free still in flight landed
    owned = evictable + protected + session_held + uncached
    pool_pages = alloc.pool.stats().used_pages
    leak = held != owned or pool_pages != held // PAGE_TOKENS + 1
    msg = (
        f"[zipkv] held_tokens={held}, evictable={evictable}, protected={protected}, "
        f"session_held={session_held}, uncached={uncached}, pool_used_pages={pool_pages}, "
        f"available_tokens={alloc.available_size()}"
    )
    return leak, msg

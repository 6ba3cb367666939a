"""SGLang's batch_is_full latch released when compression frees room (sglang/admission_latch.py).

Runs over zipkv's real SGLang allocator on the CPU (PagePool + the torch reference encoder); the running
batch is a stand-in for SGLang's ScheduleBatch (only its ``batch_is_full`` flag is read and written).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from test_sglang_pool import fill, make

from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engines.sglang.admission_latch import AdmissionLatch


def _prefill(alloc, tokens: int):  # type: ignore[no-untyped-def]
    out = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([tokens]), torch.tensor([tokens]),
        torch.tensor([-1]), tokens,
    )  # fmt: skip
    assert out is not None
    return out


def test_latch_is_released_once_compression_frees_room_and_not_before() -> None:
    alloc = make(128 * PAGE_TOKENS)  # 96 pages compressed free more than the encode margin
    out = _prefill(alloc, 96 * PAGE_TOKENS)
    alloc.compress_step()
    fill(alloc, out)
    batch = SimpleNamespace(batch_is_full=True)  # SGLang found no room for the next request
    latch = AdmissionLatch()
    assert latch.release(batch, alloc) is False and batch.batch_is_full  # first sight: remembered
    assert latch.release(batch, alloc) is False and batch.batch_is_full  # nothing changed: kept
    alloc.compress_step()  # the filled pages go to the encoder
    for _ in range(4):
        if alloc.pool.stats().compressed_pages == 96:
            break
        alloc.compress_step()
    assert alloc.pool.stats().compressed_pages == 96
    assert latch.release(batch, alloc) is True and not batch.batch_is_full  # SGLang will try again
    alloc.free(out)


def test_latch_stays_while_the_pool_only_shrinks_and_resets_when_sglang_clears_it() -> None:
    alloc = make(compression=False)
    out = _prefill(alloc, 16 * PAGE_TOKENS)
    batch = SimpleNamespace(batch_is_full=True)
    latch = AdmissionLatch()
    latch.release(batch, alloc)
    more = _prefill(alloc, 4 * PAGE_TOKENS)  # decode growth takes room: never a reason to retry
    assert latch.release(batch, alloc) is False and batch.batch_is_full
    batch.batch_is_full = False  # a request finished: SGLang cleared it itself
    assert latch.release(batch, alloc) is False and latch.seen_headroom_tokens is None
    alloc.free(out)
    alloc.free(more)

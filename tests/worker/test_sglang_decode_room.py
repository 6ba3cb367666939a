"""SGLang's decode check and retraction over zipkv's allocator while the device is behind (CPU).

On the GPU a free lands in the pool only once its page ids' copy to the host is done, and a prefill's raw
pages shrink only once its encode's sizes are read back: both a forward step behind the scheduler. SGLang's
retraction loop releases a request and looks at ``available_size()`` again at once. `LateDevice` stands in
for the GPU's timing on the CPU (no GPU here): readback copies and encode fences complete only when the
scheduler waits for the device. The pool, allocator, encoder and readback queue are the real ones.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_sglang_pool import fill, make

from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.engines.sglang import readback, seams
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator

REQUEST_PAGES = 8


class LateDevice:
    """The device a forward step behind the scheduler: what is issued in step k completes when step k + 1
    begins (``step``) or when the scheduler waits for the device (``wait``)."""

    def __init__(self, alloc: ZipkvAllocator, monkeypatch: pytest.MonkeyPatch) -> None:
        self.issuing, self.completed, self.waits = 0, 0, 0
        real_copy = readback.copy_to_host

        def late_copy(device_ids: torch.Tensor | None) -> tuple[torch.Tensor | None, Any]:
            host, _ = real_copy(device_ids)
            return host, (None if host is None else Late(self, self.issuing))

        def settle() -> None:
            self.wait()
            alloc.pool.ledger.poll()

        monkeypatch.setattr(readback, "copy_to_host", late_copy)
        monkeypatch.setattr(alloc.pool.ledger, "new_fence", lambda: Late(self, self.issuing))
        monkeypatch.setattr(alloc.pool, "settle", settle)

    def step(self) -> None:
        self.completed, self.issuing = self.issuing, self.issuing + 1

    def wait(self) -> None:
        self.completed = self.issuing
        self.waits += 1


class Late:
    """A copy's event (torch.cuda.Event's ``query``/``synchronize``) or an encode's fence (``done``) for
    work issued in step ``issued``."""

    def __init__(self, device: LateDevice, issued: int) -> None:
        self.device, self.issued = device, issued

    def query(self) -> bool:
        return self.device.completed >= self.issued

    done = query

    def synchronize(self) -> None:
        self.device.wait()


def running_pool(
    fmt: PageFormat, monkeypatch: pytest.MonkeyPatch
) -> tuple[ZipkvAllocator, list[torch.Tensor], LateDevice]:
    """Requests of REQUEST_PAGES pages, one prefilled per forward step (its pages encoded two steps later,
    as on the GPU), until their next decode step, a page each, does not fit the room the pool sees."""
    alloc = make(raw_tokens=128 * PAGE_TOKENS, fmt=fmt)
    device = LateDevice(alloc, monkeypatch)
    running: list[torch.Tensor] = []
    while alloc.headroom_pages() >= len(running):
        device.step()
        alloc.compress_step()  # marks what the step before last wrote, launches its encode
        tokens = REQUEST_PAGES * PAGE_TOKENS
        one = torch.tensor([tokens])
        out = alloc.alloc_extend(torch.tensor([0]), torch.tensor([0]), one, one, torch.tensor([-1]), tokens)
        if out is None:
            break
        fill(alloc, out, seed=len(running))
        running.append(out)
    assert len(running) >= 4, "the pool should hold a few requests"
    return alloc, running, device


def check_decode_mem(alloc: ZipkvAllocator, running: int, decode_room: bool) -> bool:
    """SGLang's check for ``running`` requests each at a page boundary (no cache to evict from), with the
    seam (seams._patch_decode_check) or without it."""
    need = running * PAGE_TOKENS
    return alloc.available_size() >= need or (decode_room and alloc.decode_room(need))


def retract_decode(alloc: ZipkvAllocator, running: list[torch.Tensor], decode_room: bool) -> int:
    """SGLang's retract_decode loop: release requests, the last one first, until the check passes; keep one.
    Returns how many it released."""
    kept = list(running)
    while len(kept) > 1 and not check_decode_mem(alloc, len(kept), decode_room):
        alloc.free(kept.pop())
    return len(running) - len(kept)


def test_the_room_of_an_encode_in_flight_passes_the_decode_check_without_a_retraction(
    fmt: PageFormat, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc, running, device = running_pool(fmt, monkeypatch)
    assert not check_decode_mem(alloc, len(running), decode_room=False)
    assert retract_decode(alloc, running, decode_room=True) == 0
    assert device.waits > 0, "the room came from waiting for the device"
    assert alloc.pool.compacted_pages == 0, "and from nothing else: no page had to move"


def test_retraction_releases_what_the_step_needs_not_every_request(
    fmt: PageFormat, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The H100 trace sweep at 2 req/s: SGLang released 27 of 37 running requests in one step and logged
    # "#new_tokens_gained: 0", because none of their frees had landed when it looked again.
    released = {}
    for decode_room in (False, True):
        with monkeypatch.context() as m:
            alloc, running, device = running_pool(fmt, m)
            device.wait()
            alloc.compress_step()  # every encode in: what is short now, only releasing can give
            held = alloc.alloc(alloc.headroom_pages() * PAGE_TOKENS)
            assert held is not None and alloc.headroom_pages() == 0
            device.step()
            released[decode_room] = retract_decode(alloc, running, decode_room)
            kept = len(running) - released[decode_room]
            assert alloc.alloc_decode(*decode_batch(alloc, kept)) is not None or not decode_room
    assert released[False] == len(running) - 1, "without the seam no release is seen before the next"
    assert 1 <= released[True] <= len(running) // 2, released


def decode_batch(alloc: ZipkvAllocator, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """alloc_decode's arguments for ``n`` requests whose next token opens a page."""
    seq = torch.full((n,), REQUEST_PAGES * PAGE_TOKENS + 1)
    return seq, seq, torch.zeros(n, dtype=torch.int64)


class Batch:
    """The surface of SGLang's ScheduleBatch the seam uses (no sglang here)."""

    def __init__(self, allocator: object, fits: bool, running: int) -> None:
        self.token_to_kv_pool_allocator, self.fits, self.running = allocator, fits, running

    def check_decode_mem(self, selected_indices: list[int] | None = None) -> bool:
        return self.fits

    def new_tokens_required_next_decode(self, selected_indices: list[int] | None = None) -> int:
        return (self.running if selected_indices is None else len(selected_indices)) * PAGE_TOKENS


def test_the_seam_asks_zipkvs_allocator_only_after_sglangs_check_failed(
    fmt: PageFormat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(seams._CLASSES, "allocator", ZipkvAllocator)
    monkeypatch.setattr(Batch, "check_decode_mem", Batch.check_decode_mem)  # restored after the test
    seams._patch_decode_check(Batch)
    alloc, running, device = running_pool(fmt, monkeypatch)
    assert Batch(alloc, fits=True, running=len(running)).check_decode_mem() and device.waits == 0
    assert Batch(alloc, fits=False, running=len(running)).check_decode_mem() and device.waits > 0
    assert not Batch(object(), fits=False, running=1).check_decode_mem(), "other allocators: SGLang's answer"
    too_many = Batch(alloc, fits=False, running=alloc.max_pages)
    assert not too_many.check_decode_mem()
    assert too_many.check_decode_mem(selected_indices=[0]), "the retraction loop's smaller batch fits"

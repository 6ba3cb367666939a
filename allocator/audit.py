"""Consistency checks of a Ledger (used by the tests; cheap enough to call after every operation).

``check(ledger)`` raises AssertionError naming the first broken invariant:
- every chunk is in exactly one place (pool, a layer's empty list, a layer's RAW/LOG chunks, draining);
- no two live pages, free slots or in-flight raw slots overlap anywhere in the heap, and each lies in a
  chunk its layer owns, of the right kind (raw pages in RAW chunks, compressed in LOG below the bump);
- bytes are conserved: each chunk's live count equals the pages in it, RAW chunks' slots add up, and live
  + free slots + dead + unplaced tails + empty chunks == the whole budget.
"""

from __future__ import annotations

import numpy as np

from zipkv.allocator.ledger import Ledger
from zipkv.allocator.plans import ChunkKind, PageState


def _intervals(led: Ledger) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, length, layer, expected chunk kind) of everything that occupies units."""
    starts, lengths, layers, kinds = [], [], [], []
    state = led.page_state
    for layer in range(led.cfg.num_layers):
        live = np.flatnonzero(state != PageState.FREE)
        on_log = state[live] >= PageState.ENCODING
        starts.append(led.page_unit[layer, live])
        lengths.append(led.page_units[layer, live])
        layers.append(np.full(live.size, layer))
        kinds.append(np.where(on_log, ChunkKind.LOG, ChunkKind.RAW))
        slots = np.asarray(led.slots[layer], dtype=np.int64)
        starts.append(slots)
        lengths.append(np.full(slots.size, led.raw))
        layers.append(np.full(slots.size, layer))
        kinds.append(np.full(slots.size, ChunkKind.RAW))
    for batch in led.batches:  # raw slots an encode launch still reads
        starts.append(batch.plan.src_units)
        lengths.append(np.full(batch.plan.size, led.raw))
        layers.append(batch.plan.layers)
        kinds.append(np.full(batch.plan.size, ChunkKind.RAW))
    return tuple(np.concatenate(x).astype(np.int64) for x in (starts, lengths, layers, kinds))  # type: ignore[return-value]


def check(led: Ledger) -> None:
    """Every invariant of the ledger; an AssertionError names the first one broken."""
    _check_chunk_lists(led)
    chunk, length = _check_places(led)
    _check_units(led, chunk, length)
    _check_rooms_and_reservations(led)


def _check_chunk_lists(led: Ledger) -> None:
    """Every empty chunk is listed exactly once (pool or a layer's), and draining ones by their kind."""
    cfg, kind = led.cfg, led.chunk_kind
    places = np.zeros(cfg.num_chunks, dtype=np.int64)
    np.add.at(places, np.asarray(led.pool, dtype=np.int64), 1)
    for empties in led.private_empty:
        np.add.at(places, np.asarray(empties, dtype=np.int64), 1)
    free_listed = places.copy()
    assert (free_listed[kind != ChunkKind.FREE] == 0).all(), "a listed empty chunk is in use"
    unassigned = cfg.num_chunks % cfg.num_layers if not cfg.shared_pool else 0
    assert (free_listed[kind == ChunkKind.FREE] == 1).sum() == (kind == ChunkKind.FREE).sum() - unassigned, (
        "an empty chunk is not listed exactly once"
    )
    draining = sum(chunks.size for _, chunks in led.draining)
    assert draining == (kind == ChunkKind.DRAINING).sum(), "draining list and chunk kinds differ"


def _check_places(led: Ledger) -> tuple[np.ndarray, np.ndarray]:
    """Live pages and free slots do not overlap, each inside one chunk of its layer and of the right kind,
    compressed ones below their chunk's bump pointer. Returns each interval's (chunk, length)."""
    cu, kind = led.cu, led.chunk_kind
    start, length, layer, want = _intervals(led)
    order = np.argsort(start, kind="stable")
    s, e = start[order], start[order] + length[order]
    assert (s >= 0).all() and (length > 0).all(), "a live page or slot has no place"
    overlap = np.flatnonzero(s[1:] < e[:-1])
    assert overlap.size == 0, f"overlap at units {s[overlap[:3]].tolist()}"
    chunk = start // cu
    assert ((start + length - 1) // cu == chunk).all(), "a page straddles two chunks"
    assert (led.chunk_owner[chunk] == layer).all(), "a page lies in a chunk its layer does not own"
    assert (kind[chunk] == want).all(), "a page lies in a chunk of the wrong kind"
    on_log = want == ChunkKind.LOG
    assert (start[on_log] + length[on_log] <= chunk[on_log] * cu + led.chunk_bump[chunk[on_log]]).all(), (
        "a compressed page lies past its chunk's bump pointer"
    )
    return chunk, length


def _check_units(led: Ledger, chunk: np.ndarray, length: np.ndarray) -> None:
    """Bytes: each chunk's live units recounted from the pages and slots in it, and every unit of the
    heap accounted for once (live, free slot, dead, tail or empty chunk)."""
    cfg, cu, kind = led.cfg, led.cu, led.chunk_kind
    free_slots = sum(len(x) for x in led.slots)
    occupied = np.zeros(cfg.num_chunks, dtype=np.int64)
    np.add.at(occupied, chunk, length)
    slot_units = np.zeros(cfg.num_chunks, dtype=np.int64)
    for slots in led.slots:
        arr = np.asarray(slots, dtype=np.int64)
        np.add.at(slot_units, arr // cu, led.raw)
    live = occupied - slot_units
    assert (live == led.chunk_live).all(), (
        f"chunk live units disagree with their pages at chunks {np.flatnonzero(live != led.chunk_live)[:5]}"
    )
    raw_chunks = kind == ChunkKind.RAW
    assert (occupied[raw_chunks] == cu).all(), "a RAW chunk's pages and free slots do not fill it"
    assert int(led.free_slots.sum()) == free_slots, "free slot counters disagree with the slot stacks"
    log = kind == ChunkKind.LOG
    assert (led.chunk_live[log] <= led.chunk_bump[log]).all() and (led.chunk_bump <= cu).all()
    dead = int((led.chunk_bump[log] - led.chunk_live[log]).sum())
    tails = int((cu - led.chunk_bump[log]).sum())
    empty = int(((kind == ChunkKind.FREE) | (kind == ChunkKind.DRAINING)).sum()) * cu
    assert int(led.chunk_live[~(raw_chunks | log)].sum()) == 0, "an empty chunk holds live units"
    total = int(led.chunk_live.sum()) + free_slots * led.raw + dead + tails + empty
    assert total == cfg.num_chunks * cu, f"units not conserved: {total} != {cfg.num_chunks * cu}"


def _check_rooms_and_reservations(led: Ledger) -> None:
    """The room lists match their flags and hold only their layer's LOG chunks; reservations add up."""
    kind = led.chunk_kind
    assert led.reserved_pages == sum(led.reservations.values()) >= 0, "reservation total drifted"
    listed = [c for rooms in led.log_rooms for c in rooms]
    assert len(listed) == len(set(listed)) == int(led.in_rooms.sum()), "room lists and flags differ"
    for owner, rooms in enumerate(led.log_rooms):
        assert all(kind[c] == ChunkKind.LOG and led.chunk_owner[c] == owner for c in rooms), (
            "a room list holds a chunk that is not its layer's LOG chunk"
        )

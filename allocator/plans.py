"""Plain records shared by the host bookkeeping and the device side: fences, plans, errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Every page location and size is a whole number of units: a pool's unit is what one compressed block of
# its format saves (pool.unit_bytes_for). 256 for formats v1/v2 (blocks of 768 and 1024 bytes), the default
# of a bare Ledger; 64 for v3 (192 and 256).
UNIT_BYTES = 256


class OutOfPages(RuntimeError):
    """New pages do not fit (or a reservation cannot be honoured). Nothing was allocated."""


class ChunkKind:
    """What a chunk holds (plain ints, stored in an int8 array and compared in hot paths)."""

    FREE = 0  # empty: in the shared pool, or held privately by a layer when there is no pool
    RAW = 1  # fixed-size slots for uncompressed pages
    LOG = 2  # compressed pages, placed one after another (bump pointer)
    DRAINING = 3  # empty, waiting for reads in flight (its fence) before it can be reused


class PageState:
    """Life of a page id (plain ints, stored in an int8 array)."""

    FREE = 0
    RAW = 1  # being written (uncompressed)
    FULL = 2  # filled, waiting for the next encode launch (still uncompressed)
    ENCODING = 3  # encode launched; its stored size arrives with the batch's fence
    COMPRESSED = 4
    NAMES = ("FREE", "RAW", "FULL", "ENCODING", "COMPRESSED")


class Fence(Protocol):
    """A point in the device's work queue. ``done()`` never blocks."""

    def done(self) -> bool: ...


class CompletedFence:
    """Fence for a device whose work has finished when the call that issued it returns (the CPU)."""

    def done(self) -> bool:
        return True


@dataclass(frozen=True)
class EncodePlan:
    """One encode launch: ``n`` (layer, page) pairs, layer-major, grouped in regions of the log.

    Region ``r`` is a run of ``count[r]`` worst-case (raw-size) places from ``base_units[r]`` in one
    chunk. The encoder writes page ``i`` at ``stage_units[i]``; the pack step then moves it to
    ``packed_units(...)``, i.e. packed one after another from the region's base.
    """

    layers: np.ndarray  # int64 [n]
    pages: np.ndarray  # int64 [n]
    src_units: np.ndarray  # int64 [n]: the raw slot the page is read from
    stage_units: np.ndarray  # int64 [n]: worst-case place the encoder writes to
    segments: np.ndarray  # int64 [n]: region of each page
    generations: np.ndarray  # int64 [n]: page generation, to ignore pages freed meanwhile
    region_first: np.ndarray  # int64 [r]: index of the region's first page
    region_base_units: np.ndarray  # int64 [r]
    region_count: np.ndarray  # int64 [r]
    region_chunk: np.ndarray  # int64 [r]

    @property
    def size(self) -> int:
        return int(self.pages.size)


@dataclass(frozen=True)
class RegionLayout:
    """Where an encode launch's worst-case places go, before any chunk is taken (encode.py plans it,
    ``ChunkTable.open_regions`` applies it).

    One entry per region, layer-major: the layer's LOG chunk it fills (-1: a chunk still to take from
    the layer's free chunks, in entry order) and its page count. ``popped``: room-list chunks the launch
    fills up (dropped from the top of their layer's list); ``stays``: a new chunk that keeps room and is
    listed.
    """

    owner: np.ndarray  # int64 [r]: layer of each region
    chunk: np.ndarray  # int64 [r]: LOG chunk, or -1 for a chunk to take
    count: np.ndarray  # int64 [r]: worst-case places in the region
    popped: np.ndarray  # int64 [p]: room-list chunks to drop (each at the top of its layer's list)
    stays: np.ndarray  # bool [r]: a new chunk that keeps room, listed once taken


@dataclass(frozen=True)
class EncodeBatch:
    """An encode launch in flight: its sizes (bytes per page) may be read once ``fence.done()``."""

    plan: EncodePlan
    fence: Fence
    read_sizes: Callable[[], np.ndarray]


@dataclass(frozen=True)
class MovePlan:
    """Compaction: compressed pages whose sizes are known move from ``src`` to ``dst``."""

    layers: np.ndarray  # int64 [m]
    pages: np.ndarray  # int64 [m]
    src_units: np.ndarray  # int64 [m]
    dst_units: np.ndarray  # int64 [m]
    size_units: np.ndarray  # int64 [m]
    emptied_chunks: np.ndarray  # int64 [k]: chunks that hold nothing once the move is done


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for the small int64 arrays of a step (sort and compare: cheaper than hashing)."""
    out = np.sort(values, kind="stable")
    if out.size > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


def packed_units(
    size_units: np.ndarray, segments: np.ndarray, region_first: np.ndarray, region_base_units: np.ndarray
) -> np.ndarray:
    """Where each encoded page lands: its region's base plus the sizes before it in the region.

    The device computes the same thing from the encoder's sizes (torch twin in ``pool.py``); the host
    repeats it when the sizes arrive, a step later.
    """
    excl = np.cumsum(size_units) - size_units
    return region_base_units[segments] + excl - excl[region_first][segments]


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool. Pages count page ids (each has a page in every layer)."""

    headroom_pages: int  # new pages that fit now, after reservations
    used_pages: int  # live page ids
    committed_pages: int  # pages reserved for running requests, not yet allocated
    raw_pages: int  # live page ids stored uncompressed
    compressed_pages: int  # live page ids stored compressed (sizes known)
    encoding_pages: int  # encode launched, sizes not yet back
    used_bytes: int  # bytes held by live pages, all layers (worst case while encoding)
    free_bytes: int  # bytes not held by live pages (includes dead bytes awaiting compaction)
    committed_bytes: int  # raw size of the committed pages, all layers
    dead_bytes: int  # inside compressed chunks, freed but not yet reclaimed
    budget_bytes: int  # bytes managed (whole chunks)
    compression_ratio: float  # stored / raw bytes over compressed pages (1.0 when none)
    pool_chunks: int  # empty chunks in the shared pool
    # Blocks (the format's unit of coding) of the compressed pages, all layers: how many stored compressed,
    # out of how many. Known on the host from the stored sizes: a compressed block takes one unit less than
    # a raw one.
    compressed_blocks: int = 0
    compressed_page_blocks: int = 0


@dataclass(frozen=True)
class LedgerConfig:
    num_layers: int
    num_chunks: int
    chunk_units: int
    raw_page_units: int
    max_pages: int
    shared_pool: bool = True
    compression: bool = True
    compaction_live_fraction: float = 0.5  # LOG chunks less live than this get their pages moved out
    unit_bytes: int = UNIT_BYTES  # bytes of a unit (sizes reach the ledger in bytes)

    def __post_init__(self) -> None:
        if self.unit_bytes < 1:
            raise ValueError(f"{self}: unit_bytes must be >= 1")
        if min(self.num_layers, self.chunk_units, self.raw_page_units, self.max_pages) < 1:
            raise ValueError(f"{self}: layers, chunk/page sizes and max_pages must all be >= 1")
        if self.chunk_units % self.raw_page_units != 0:
            raise ValueError(
                f"a chunk ({self.chunk_units} units) must hold whole raw pages ({self.raw_page_units} units);"
                " pick chunk_bytes as a multiple of the format's raw_page_bytes"
            )
        if self.num_chunks < self.num_layers:
            raise ValueError(
                f"{self.num_chunks} chunks cannot give each of {self.num_layers} layers one; "
                "raise budget_bytes or lower chunk_bytes"
            )
        if not 0.0 <= self.compaction_live_fraction < 1.0:
            raise ValueError(f"compaction_live_fraction {self.compaction_live_fraction} not in [0, 1)")

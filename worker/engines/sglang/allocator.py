"""The KV pool and allocator that zipkv puts under SGLang, over `zipkv.allocator.PagePool` (no sglang here).

SGLang addresses KV by **slot** (``page_id * 16 + offset``) in ``req_to_token`` and ``out_cache_loc``. Here a
page id is a `PagePool` page id: *virtual*, since a page's bytes live wherever ``page_loc`` says. There are
more page ids than raw pages fit in the byte budget (compressed pages take less).

`ZipkvAllocator` is the allocator logic (SGLang's paged-allocator surface: ``alloc``, ``alloc_extend``,
``alloc_decode``, ``free``, ``free_segment``, ``available_size``); `seams` mixes it into SGLang's
allocator base class. Rules that keep it sync-free on the scheduling path:

- New page ids come from the host (``PagePool.allocate``); the per-token slots are computed on the device.
- Which pages a step fills and which pages SGLang frees are only known on the device (SGLang passes slot
  tensors). They are copied to pinned host memory without a sync (readback.py) and applied, in
  order, once their copy has landed (a `torch.cuda.Event` query; on the CPU, at once). Until then capacity
  is under-counted, never over-counted.
- A page that filled during forward step N is marked full only when step N+1 starts (`compress_step`, on the
  forward stream, after step N's writes), so the encoder never reads a page before its last token is written.
- ``available_size()`` = new raw pages that fit (`PagePool.headroom_pages`) x 16, bounded by the free page
  ids: live, so SGLang's admission, retraction and load metrics see compressed capacity.
- Under tensor parallelism the ranks' schedulers must decide alike: every rank answers from a headroom the
  ranks agree on (rank_agreement.py), and whether an allocation is given is one decision for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from zipkv.allocator import OutOfPages, PagePool
from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engines.sglang.host_timing import WAITED, time_host_calls
from zipkv.worker.engines.sglang.kv_stats_board import PUBLISH_EVERY_STEPS, KVStatsBoard
from zipkv.worker.engines.sglang.rank_agreement import RankAgreement, agreed_new_pages
from zipkv.worker.engines.sglang.readback import ReadbackQueue
from zipkv.worker.engines.sglang.reclaim import PrefixCache, decode_room, overcount_tokens, reclaim
from zipkv.worker.engines.sglang.slots import decode_slots, extend_slots, plan_extend, to_device
from zipkv.worker.engines.sglang.telemetry import log_pool_step, log_reclaim_failure

LOG_EVERY_STEPS = 128  # a pool line in the scheduler's log (INFO) every this many forward steps
DECODE_RESERVE_PAGES = 64  # until the seams set SGLang's max_running_requests (available_size)
PAD_PAGE = 0  # SGLang writes padded (CUDA-graph) rows to slot 0: page 0 must stay allocated and raw


ExtendKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


class ZipkvAllocator:
    """SGLang's paged-allocator surface over a `PagePool` (see the module docstring)."""

    def __init__(self, pool: PagePool, device: str | torch.device, compression: bool) -> None:
        self.pool = pool
        self.device = torch.device(device)
        self.compression = compression
        self.page_size = PAGE_TOKENS
        self.max_pages = pool.max_pages
        self.size = (self.max_pages - 1) * PAGE_TOKENS  # virtual slots SGLang may address (pad excluded)
        pad = pool.allocate(1)
        if pad != [PAD_PAGE]:
            raise RuntimeError(
                f"PagePool gave page {pad} as its first page; the SGLang pool needs page 0 first"
            )
        self._live_pages = 0  # pages held by SGLang (pad excluded)
        self._readbacks = ReadbackQueue(keep=frozenset({PAD_PAGE}))  # fills and frees known on the device
        self._forward_step = 0
        self._decode_reqs = 0  # requests of the last decode batch, 0 after a prefill (for the pool line)
        self._in_free_group = False
        self._free_group: list[torch.Tensor] = []
        self.extend_kernel: ExtendKernel | None = None  # SGLang's Triton alloc_extend_kernel (the seams')
        self.prefix_cache: PrefixCache | None = None  # SGLang's radix cache, when on (set by the seams)
        self.stats_board: KVStatsBoard | None = None  # the replica's /metrics source (set by the seams)
        self.ranks: RankAgreement | None = None  # set under tensor parallelism (agree_across_ranks)
        # Pages a decode step may need (one per running request): never held back from available_size().
        # SGLang's max_running_requests, set by the seams with the prefix cache; this default until then.
        self.decode_reserve_pages = DECODE_RESERVE_PAGES
        self.host_s = time_host_calls(self)  # per call on the scheduling path, for the pool line

    # ---- capacity -----------------------------------------------------------------------------------
    def free_page_ids(self) -> int:
        return self.max_pages - 1 - self._live_pages

    def agree_across_ranks(self) -> None:
        """Tensor parallelism: answer from the headroom the ranks agree on (rank_agreement.py), starting from
        what the empty pool fits at raw size (the same budget, format and layers on every rank)."""
        if self._live_pages:
            raise RuntimeError("agree_across_ranks must run on the empty pool, before any page is held")
        self.ranks = RankAgreement(agreed_pages=self._own_headroom_pages())

    def _own_headroom_pages(self) -> int:
        return min(self.pool.headroom_pages(), self.free_page_ids())

    def headroom_pages(self) -> int:
        """New (raw) pages that fit now: pool bytes and free page ids; under tensor parallelism, the ranks'
        agreed count less the pages allocated since."""
        return self._own_headroom_pages() if self.ranks is None else self.ranks.headroom_pages()

    def refresh_headroom(self) -> None:
        """Look again: under tensor parallelism a collective (every rank calls it at the same point), after
        which all ranks answer with the least live headroom among them; alone, the headroom is live anyway."""
        if self.ranks is not None:
            self.drain(block=False)
            self.pool.poll()
            self.ranks.agree(self._own_headroom_pages())

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` any rank holds (a collective under tensor parallelism)."""
        return value if self.ranks is None else self.ranks.max_over_ranks(value)

    def available_size(self) -> int:
        """The headroom in tokens, under SGLang's name for it: new (raw) pages that fit now, under
        compression; live, never optimistic. With a compressed radix cache, less what SGLang over-counts in
        its evictable tokens (reclaim.py)."""
        self.drain(block=False)
        # Chunks emptied by frees return to the shared pool once their fences pass; without this poll they
        # would only come back at the next forward step, and an idle server could never admit into them.
        self.pool.poll()
        tokens = self.headroom_pages() * PAGE_TOKENS
        if self.compression and self.prefix_cache is not None:
            held_back = tokens - overcount_tokens(self.prefix_cache.evictable_tokens(), self.pool.fmt)
            # SGLang's decode check wants available_size() >= a page per running request after evicting
            # only the shortfall; a compressed page's bytes return only with its chunk, so holding that
            # need back retracted every request with 3,500 pages free (trace sweep). Never held back:
            # admission's promise grows by at most that, and allocations beyond the room reclaim.
            tokens = max(held_back, min(tokens, self.decode_reserve_pages * PAGE_TOKENS), 0)
        return tokens

    def decode_room(self, need_tokens: int) -> bool:
        """SGLang's decode check failed: do ``need_tokens`` fit once late room is in (reclaim.decode_room)?"""
        decode_room(self, self.prefix_cache, -(-need_tokens // PAGE_TOKENS))
        return self.available_size() >= need_tokens

    def held_tokens(self) -> int:
        """Slots of pages SGLang holds (requests and the prefix cache), after every pending free landed."""
        self.drain(block=True)
        return self._live_pages * PAGE_TOKENS

    # ---- allocation ---------------------------------------------------------------------------------
    def _new_pages(self, n: int) -> list[int] | None:
        if self.ranks is not None:
            return agreed_new_pages(self, self.ranks, n)
        ids = self.take_pages(n)
        if ids is None and self.prefix_cache is not None:
            outcome = reclaim(self, self.prefix_cache, n)
            if outcome.fit:
                ids = self.take_pages(n)
            if ids is None:
                log_reclaim_failure(n, outcome, self.pool, self.free_page_ids())
        return ids

    def take_pages(self, n: int) -> list[int] | None:
        if n == 0:
            return []
        if n > self.free_page_ids():
            self.drain(block=True)
            if n > self.free_page_ids():
                return None
        try:
            ids = self.pool.allocate(n)
        except OutOfPages:
            self.drain(block=True)  # frees still in flight may be what is missing
            try:
                ids = self.pool.allocate(n)
            except OutOfPages:
                return None
        self._live_pages += n
        return ids

    def _to_device(self, ids: list[int]) -> torch.Tensor:
        return to_device(ids, self.device)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % PAGE_TOKENS:
            raise ValueError(
                f"alloc needs a whole number of {PAGE_TOKENS}-token pages, got {need_size} tokens"
            )
        ids = self._new_pages(need_size // PAGE_TOKENS)
        if ids is None:
            return None
        pages = self._to_device(ids)
        return (pages[:, None] * PAGE_TOKENS + torch.arange(PAGE_TOKENS, device=self.device)).reshape(-1)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        p_cpu, s_cpu = prefix_lens_cpu.tolist(), seq_lens_cpu.tolist()
        self._decode_reqs = 0
        plan = plan_extend(p_cpu, s_cpu)
        ids = self._new_pages(plan.num_new_pages)
        if ids is None:
            return None
        pages = self._to_device(ids)
        if self.extend_kernel is not None and self.device.type == "cuda":
            out = torch.empty((extend_num_tokens,), dtype=torch.int64, device=self.device)
            self.extend_kernel(prefix_lens, seq_lens, last_loc, pages, out)
        else:
            out = extend_slots(p_cpu, s_cpu, last_loc, pages)
        full, start = [], 0
        for n, f in zip(plan.new_pages_per_req, plan.full_new_pages_per_req, strict=True):
            full.extend(ids[start : start + f])
            start += n
        tail = None
        if plan.tail_fill_reqs:
            tail = last_loc[self._to_device(plan.tail_fill_reqs)] // PAGE_TOKENS
        self._record_fill(full, tail)
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        s_cpu = seq_lens_cpu.tolist()
        self._decode_reqs = len(s_cpu)
        ids = self._new_pages(sum(1 for s in s_cpu if s % PAGE_TOKENS == 1))
        if ids is None:
            return None
        out = decode_slots(s_cpu, last_loc, self._to_device(ids))
        filled = [i for i, s in enumerate(s_cpu) if s % PAGE_TOKENS == 0]
        tail = None
        if filled:
            tail = out[self._to_device(filled)] // PAGE_TOKENS
        self._record_fill([], tail)
        return out

    # ---- freeing ------------------------------------------------------------------------------------
    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self._in_free_group:
            self._free_group.append(free_index)
            return
        self._record_free(free_index // PAGE_TOKENS)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """A run of one request's kv row from token ``start_pos``: one representative slot per page."""
        if free_index.numel() == 0:
            return
        offset = start_pos % PAGE_TOKENS
        reps = free_index[::PAGE_TOKENS] if offset == 0 else free_index[:1]
        if offset:
            reps = torch.cat([reps, free_index[PAGE_TOKENS - offset :: PAGE_TOKENS]])
        self.free(reps)

    def free_group_begin(self) -> None:
        self._in_free_group, self._free_group = True, []

    def free_group_end(self) -> None:
        self._in_free_group = False
        if self._free_group:
            self.free(torch.cat(self._free_group))
        self._free_group = []

    def clear(self) -> None:
        self.drain(block=True)
        if self._live_pages:
            raise RuntimeError(f"clear() with {self._live_pages} pages still held; free them first")

    # ---- the readback queue -------------------------------------------------------------------------
    def _record_fill(self, known: list[int], device_ids: torch.Tensor | None) -> None:
        if not self.compression or (not known and device_ids is None):
            return
        self._readbacks.add_fill(self._forward_step + 1, known, device_ids)

    def _record_free(self, page_ids: torch.Tensor) -> None:
        self._readbacks.add_free(page_ids)
        self.drain(block=False)

    def drain(self, block: bool) -> None:
        """Apply landed readbacks in order; with ``block``, wait for all of them (idle checks, OOM)."""
        t0 = time.perf_counter()
        self._readbacks.drain(block, self.put_back_pages)
        self.host_s[WAITED] += (time.perf_counter() - t0) if block else 0.0

    def put_back_pages(self, page_ids: list[int]) -> None:
        self.pool.free(page_ids)
        self._live_pages -= len(page_ids)

    def compress_step(self) -> int:
        """At the start of each forward step (forward stream): mark the pages that the previous steps
        filled and run the pool's step (one encode launch). Returns the number of pages marked."""
        self._forward_step += 1
        self.drain(block=False)
        pages = self._readbacks.take_filled(self._forward_step)
        if pages:
            self.pool.mark_full(pages)
        self.pool.end_step()
        if self.stats_board is not None and self._forward_step % PUBLISH_EVERY_STEPS == 0:
            self.stats_board.publish_pool(self.pool)
        if self._forward_step % LOG_EVERY_STEPS == 0:
            log_pool_step(self._forward_step, self.pool, self._live_pages, self._decode_reqs, self.host_s)
        return len(pages)

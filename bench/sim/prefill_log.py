"""Prefill batch times read from SGLang 0.5.17's "Prefill batch" log lines, and a least-squares cost model.

SGLang logs a prefill batch when its result is processed (batch_result_processor.process_batch_result_prefill
-> metrics_reporter.report_prefill_stats), i.e. right after the batch finished on the GPU, with the batch's
new (uncached) tokens and `input throughput = new tokens / seconds since the previous prefill line`. So
`new / throughput` is the wall time between the two lines: the batch's own forward when the batch before it
was a prefill too and nothing ran between. That holds when the previous line still had prefill work left
(`#pending-token` > 0: the rest of a chunked prompt or waiting prompts, counted when it was scheduled, or
`#queue-req` > 0); only those gaps are fitted ("back to back"); the others include decode steps or idle time.

A line gives the batch's totals (#new-seq, #new-token, #cached-token), not each sequence's. The sequences
are rebuilt as SGLang's PrefillAdder forms a batch: the prompt being chunked goes first (its context starts
after its earlier chunks), then new prompts, whose context starts after their cached prefix; a batch that
fills the chunk budget (`chunked_prefill_size`) ends in a truncated prompt that the next batch continues. How
a batch's tokens split among several sequences is not logged: the continued prompt takes what `#pending-token`
said was left of it when nothing else waited, else an equal share, and the cached tokens and new tokens of
the new prompts are split equally. Attention work per sequence: new x (start + new / 2) context pairs.

Cost model of one prefill batch (`fit_prefill`):
    batch_ms = fixed_ms + ms_per_1k_tokens * new / 1e3 + ms_per_1m_pairs * pairs / 1e6,
    pairs = sum(new_i * (start_i + new_i / 2))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.sim.step_model import attention_pairs, batch_prefill_ms

SWEEP_CHUNK_TOKENS = 8192  # the serving sweep's chunked_prefill_size (bench/run_serving_gpu.sh's SGLANG_ARGS)
PREFILL = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), .*?#queue-req: (\d+), "
    r"#pending-token: (\d+), .*input throughput \(token/s\): ([\d.]+)"
)
DECODE = "Decode batch"


@dataclass(frozen=True, slots=True)
class PrefillLine:
    seqs: int
    new_tokens: int
    cached_tokens: int
    queued: int
    pending_tokens: int
    gap_ms: float  # since the previous prefill line: new_tokens / input throughput
    after_decode: bool  # a decode line came between this and the previous prefill line


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    seqs: tuple[tuple[int, int], ...]  # (new tokens, context start) per sequence
    gap_ms: float
    back_to_back: bool  # the gap is this batch's forward alone
    known: bool = True  # every sequence's share and start follow from the log
    chain: int = -1  # >= 0: only the rest of the prompt chunked out of the batch before (chain id)

    @property
    def new_tokens(self) -> int:
        return sum(n for n, _ in self.seqs)

    @property
    def attention_pairs(self) -> float:
        return attention_pairs(self.seqs)


def parse_lines(lines: Iterable[str]) -> list[PrefillLine]:
    out, saw_decode = [], False
    for line in lines:
        if DECODE in line:
            saw_decode = True
            continue
        m = PREFILL.search(line)
        if m is None:
            continue
        new, thr = int(m[2]), float(m[6])
        gap = 1000.0 * new / thr if thr > 0 else float("inf")
        out.append(PrefillLine(int(m[1]), new, int(m[3]), int(m[4]), int(m[5]), gap, saw_decode))
        saw_decode = False
    return out


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal integers (the remainder on the first ones)."""
    q, r = divmod(total, parts)
    return [q + (i < r) for i in range(parts)]


def _batch_seqs(ln: PrefillLine, cont: int | None, left: int) -> tuple[list[tuple[int, int]], bool]:
    """One batch's sequences given the context `cont` of the prompt it continues (None: none) and what the
    previous line said was pending (the continued prompt's rest when nothing else waited); known: whether
    the continued prompt's share is."""
    seqs: list[tuple[int, int]] = []
    new_left, n_new, known = ln.new_tokens, ln.seqs, True
    if cont is not None and n_new > 0:
        known = n_new == 1 or left < new_left
        take = new_left if n_new == 1 else min(left, new_left) if known else new_left // n_new
        seqs.append((take, cont))
        new_left, n_new = new_left - take, n_new - 1
    if n_new > 0:
        cached = _split(ln.cached_tokens, n_new)
        seqs += [(n, c) for n, c in zip(_split(new_left, n_new), cached, strict=True) if n > 0]
    return seqs, known


def rebuild_batches(lines: Sequence[PrefillLine], chunk_tokens: int) -> list[PrefillBatch]:
    """Each line's sequences (new tokens, context start), whether its gap is its own forward, whether its
    sequences are known (a continued prompt's share is known when it is the batch's only sequence or when
    the previous line's `#pending-token` is less than the batch, so nothing else waited; a prompt chunked
    out of a batch not known stays not known), and its chain: consecutive back-to-back batches holding
    nothing but the next chunk of one prompt share an id."""
    out: list[PrefillBatch] = []
    cont: int | None = None  # context so far of the prompt being chunked; None: none is
    cont_known, chain, chains = True, -1, 0
    prev: PrefillLine | None = None
    for ln in lines:
        seqs, share_known = _batch_seqs(ln, cont, prev.pending_tokens if prev is not None else 0)
        only_cont = cont is not None and ln.seqs == 1
        known = share_known and (cont_known or cont is None)
        back = prev is not None and not ln.after_decode and (prev.pending_tokens > 0 or prev.queued > 0)
        if only_cont and back:
            chain = chain if chain >= 0 else chains
            chains = max(chains, chain + 1)
        else:
            chain = -1
        chunked = ln.new_tokens >= chunk_tokens and ln.pending_tokens > 0 and bool(seqs)
        cont = seqs[-1][0] + seqs[-1][1] if chunked else None
        cont_known = known if (chunked and not only_cont) else (cont_known and known)
        out.append(PrefillBatch(tuple(seqs), ln.gap_ms, back, known, chain))
        prev = ln
    return out


def back_to_back(lines: Sequence[PrefillLine], chunk_tokens: int) -> list[PrefillBatch]:
    """The batches of a log's prefill lines whose gaps are their own forwards (rebuild_batches'
    back_to_back)."""
    return [b for b in rebuild_batches(lines, chunk_tokens) if b.back_to_back]


@dataclass(frozen=True, slots=True)
class PrefillFit:
    fixed_ms: float
    ms_per_1k_tokens: float
    ms_per_1m_pairs: float  # attention: per million (new token, context token) pairs
    chain_batches: int  # fitted the attention slope
    batches: int  # fitted the per-token cost
    median_abs_error: float  # relative, of batch_ms against the gaps, over the latter

    def batch_ms(self, seqs: Iterable[tuple[int, int]]) -> float:
        return batch_prefill_ms(self.fixed_ms, self.ms_per_1k_tokens, self.ms_per_1m_pairs, seqs)


def chain_slope(batches: Sequence[PrefillBatch]) -> tuple[float, int]:
    """ms per million attention pairs: least squares of the gap on the pairs with one intercept per chain
    (a prompt's consecutive chunks; where the chain starts is not always known, how far apart its chunks
    are is), over chains of at least two batches. Returns the slope and the batches used."""
    by_chain: dict[int, list[PrefillBatch]] = {}
    for b in batches:
        if b.chain >= 0:
            by_chain.setdefault(b.chain, []).append(b)
    chains = [c for c in by_chain.values() if len(c) >= 2]
    if not chains:
        raise ValueError("no chunked prompt ran two back-to-back chunks: no attention slope")
    rows, ys = [], []
    for i, c in enumerate(chains):
        for b in c:
            rows.append([float(i == j) for j in range(len(chains))] + [b.attention_pairs / 1e6])
            ys.append(b.gap_ms)
    sol = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]
    return float(sol[-1]), len(ys)


def fit_prefill(batches: Sequence[PrefillBatch], fixed_ms: float, min_tokens: int = 1024) -> PrefillFit:
    """The attention slope from the chains (chain_slope); then, with a batch's fixed cost `fixed_ms` (a
    forward's floor: the decode fit's fixed part), the per-token cost as the median over the back-to-back
    batches of at least `min_tokens` of (gap - fixed - attention) / new tokens (a median: the shares of
    several sequences in one batch are estimates)."""
    slope, n_chain = chain_slope(batches)
    use = [b for b in batches if b.back_to_back and b.new_tokens >= min_tokens and b.gap_ms < 1e5]
    if len(use) < 3:
        raise ValueError(f"{len(use)} back-to-back prefill batches: at least 3 needed")
    per_tok = [(b.gap_ms - fixed_ms - slope * b.attention_pairs / 1e6) / b.new_tokens for b in use]
    fit = PrefillFit(
        fixed_ms, round(1e3 * float(np.median(per_tok)), 4), round(slope, 5), n_chain, len(use), 0.0
    )
    err = np.median([abs(fit.batch_ms(b.seqs) / b.gap_ms - 1.0) for b in use])
    return PrefillFit(
        fit.fixed_ms, fit.ms_per_1k_tokens, fit.ms_per_1m_pairs, n_chain, len(use), round(float(err), 4)
    )

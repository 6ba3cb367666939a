"""Worker step times fitted to the H200 measurements in bench/results/sglang_e2e.json (docs/benchmarks.md,
"SGLang end to end (H200)"): Llama-3.1-8B shape, one H200, SGLang 0.5.17.

Decode (one forward of the running batch, milliseconds):
    decode_ms = fixed_ms + ms_per_kv_gb[system] * kv_gb,  kv_gb = batch context tokens x 131,072 B / 1e9
Decode is memory-bound: every step reads the weights (~16 GB, the fixed part, shared by every system running
the same model on the same GPU) and each running request's whole KV (raw bytes; the per-system slope folds
in how fast that system's attention reads them: zipkv reads 0.76 of the bytes, compressed). Fitted by least
squares to the seven decode measurements (three workloads x three systems; `DECODE_POINTS`), four
parameters; the residuals go into cluster_sim.json.

Prefill (one forward of `new` prompt tokens whose context starts at `start` tokens):
    prefill_ms = fixed_ms + new * (1 + ATTENTION_PER_CONTEXT_TOKEN * (start + new / 2)) / prefill_tokens_per_s
The linear part is the GEMMs; the attention part grows with the context each token attends to, in the ratio
of their FLOPs (Llama-3.1-8B: 524,288 attention FLOPs per context token against 16.06 GFLOPs of weights per
token: 3.26e-5; derived, not measured: every measured prompt was <= 8,192 tokens). `prefill_tokens_per_s`
is fitted per system by replaying the offline measurement (64 x 8192 -> 256 at once) through the simulated
engine and matching its mean TTFT (bench/sim/sim_calibrate.py).

A model may instead carry a measured per-batch prefill cost (`prefill_ms_per_1k_tokens` set; the H100
calibration, bench/sim/h100_calibration.py): one batch of sequences (new, start) takes
    fixed_ms + prefill_ms_per_1k_tokens * sum(new) / 1e3 + prefill_ms_per_1m_pairs * pairs / 1e6,
    pairs = sum(new * (start + new / 2))
with the attention slope measured per system (it differs between SGLang's and zipkv's prefill kernels).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench import paths
from bench.serving.trace_workload import KV_BYTES_PER_TOKEN

RESULTS = paths.RESULTS / "sglang_e2e.json"
GIB_PER_GB = float(1 << 30) / 1e9
ATTENTION_PER_CONTEXT_TOKEN = 4 * 32 * 32 * 128 / (2 * 8.03e9)  # 2 matmuls x 2 FLOPs x layers x q heads x dim
SYSTEMS = ("sglang", "zipkv_uncompressed", "zipkv")
E2E_NAMES = {"sglang": "flashinfer", "zipkv_uncompressed": "zipkv_uncompressed", "zipkv": "zipkv"}
# The mean context per request during each measured decode phase: prompt + half the outputs (offline: at
# the largest batch, all prompts in, outputs 0..256; online: the whole decode phase; prefix: 3072 + 16).
WORKLOAD_CONTEXT_TOKENS = {
    "offline_8192x256": 8192 + 128,
    "online_1024x8192": 1024 + 4096,
    "prefix_3072x32": 3088,
}


def attention_pairs(seqs: Iterable[tuple[int, int]]) -> float:
    """A prefill batch's attention work: (new token, context token) pairs over its (new tokens, context
    start) sequences, each new token against its context and the new tokens before it."""
    return sum(n * (s + n / 2) for n, s in seqs)


def batch_prefill_ms(
    fixed_ms: float, ms_per_1k_tokens: float, ms_per_1m_pairs: float, seqs: Iterable[tuple[int, int]]
) -> float:
    """The measured per-batch prefill cost (module docstring) of (new tokens, context start) sequences."""
    seqs = list(seqs)
    new = sum(n for n, _ in seqs)
    return fixed_ms + ms_per_1k_tokens * new / 1e3 + ms_per_1m_pairs * attention_pairs(seqs) / 1e6


@dataclass(frozen=True, slots=True)
class StepModel:
    system: str
    fixed_ms: float
    ms_per_kv_gb: float
    prefill_tokens_per_s: float = 38000.0  # replaced by the calibrated value
    prefill_ms_per_1k_tokens: float | None = None  # set: the measured per-batch prefill cost (above)
    prefill_ms_per_1m_pairs: float = 0.0

    def decode_ms(self, context_tokens: int) -> float:
        return self.fixed_ms + self.ms_per_kv_gb * context_tokens * KV_BYTES_PER_TOKEN / 1e9

    def prefill_ms(self, new_tokens: int, start_tokens: int) -> float:
        work = new_tokens * (1.0 + ATTENTION_PER_CONTEXT_TOKEN * (start_tokens + new_tokens / 2))
        return self.fixed_ms + 1000.0 * work / self.prefill_tokens_per_s

    def prefill_batch_ms(self, seqs: list[tuple[int, int]]) -> float:
        """One prefill batch of (new tokens, context start) sequences."""
        if self.prefill_ms_per_1k_tokens is None:
            return sum(self.prefill_ms(n, s) for n, s in seqs)
        return batch_prefill_ms(
            self.fixed_ms, self.prefill_ms_per_1k_tokens, self.prefill_ms_per_1m_pairs, seqs
        )

    def with_prefill(self, tokens_per_s: float) -> StepModel:
        return replace(self, prefill_tokens_per_s=tokens_per_s)


@dataclass(frozen=True, slots=True)
class DecodePoint:
    system: str
    workload: str
    batch: int
    context_tokens: int  # of the whole batch
    step_ms: float  # measured


def decode_points(path: Path = RESULTS) -> list[DecodePoint]:
    rows = json.loads(path.read_text())["rows"]
    by_name = {v: k for k, v in E2E_NAMES.items()}
    out = []
    for r in rows:
        system, ctx = by_name.get(r["system"]), WORKLOAD_CONTEXT_TOKENS.get(r["workload"])
        if system is None or ctx is None or r.get("rc") != 0:
            continue
        batch = int(r["max_running_requests"])
        out.append(DecodePoint(system, r["workload"], batch, batch * ctx, float(r["decode_step_ms"])))
    return out


def fit_decode(points: list[DecodePoint]) -> tuple[dict[str, StepModel], list[dict[str, object]]]:
    """Least squares: a shared fixed_ms and one slope per system. Returns the models and, per point, the
    fitted and measured step and the leave-one-out prediction (the point left out of its own fit)."""
    x = np.array(
        [
            [1.0] + [p.context_tokens * KV_BYTES_PER_TOKEN / 1e9 * (p.system == s) for s in SYSTEMS]
            for p in points
        ]
    )
    y = np.array([p.step_ms for p in points])
    sol = np.linalg.lstsq(x, y, rcond=None)[0]
    models = {s: StepModel(s, float(sol[0]), float(sol[1 + i])) for i, s in enumerate(SYSTEMS)}
    table = []
    for i, p in enumerate(points):
        keep = [j for j in range(len(points)) if j != i]
        loo = np.linalg.lstsq(x[keep], y[keep], rcond=None)[0]
        table.append(
            {
                "system": p.system,
                "workload": p.workload,
                "batch": p.batch,
                "kv_gb": round(p.context_tokens * KV_BYTES_PER_TOKEN / 1e9, 2),
                "measured_ms": p.step_ms,
                "fitted_ms": round(float(x[i] @ sol), 3),
                "residual_ms": round(float(x[i] @ sol) - p.step_ms, 3),
                "leave_one_out_ms": round(float(x[i] @ loo), 3),
            }
        )
    return models, table


def measured(system: str, workload: str, path: Path = RESULTS) -> dict[str, object]:
    """The e2e row of one system and workload (for the prefill calibration)."""
    for r in json.loads(path.read_text())["rows"]:
        if r["system"] == E2E_NAMES[system] and r["workload"] == workload:
            return dict(r)
    raise KeyError(f"no {workload} row for {system} in {path}")


def budget_tokens(path: Path = RESULTS) -> int:
    return int(json.loads(path.read_text())["budget_tokens"])

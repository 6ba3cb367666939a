"""What the SGLang end-to-end bench runs: systems, milestones (SGLang flag sets), workloads and run specs.

bench_sglang_e2e.py orchestrates the runs and records the results; this module is the data it runs from,
with the parser for ``--runs`` (``SYSTEM:MILESTONE[:WORKLOAD[:TIMEOUT_S]]``) and the SGLang engine arguments
every system shares (page size 16, dummy weights, temperature 0, one KV budget). Split from the bench so the
run matrix can be read and tested (tests/bench/test_sglang_e2e_metrics.py) without the orchestration.
Milestone ``tp2`` is ``m2`` at tensor parallelism 2 (two GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYSTEMS = ("zipkv", "zipkv_uncompressed", "triton", "flashinfer")
MILESTONES: dict[str, dict[str, Any]] = {
    "m1": {
        "disable_cuda_graph": True,
        "disable_overlap_schedule": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
    },
    "m2": {
        "disable_prefill_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "cuda_graph_max_bs_decode": 64,
    },
    "m3": {"disable_prefill_cuda_graph": True, "chunked_prefill_size": 2048, "cuda_graph_max_bs_decode": 64},
}
# Tensor parallelism over two GPUs: milestone 2's flags with tp_size=2 (each GPU holds half the KV heads, so
# the same max_total_tokens is half the KV bytes per GPU, for every system alike).
MILESTONES["tp2"] = {**MILESTONES["m2"], "tp_size": 2}
BUDGET_TOKENS = 46 * 8448
DECODE_LOG_INTERVAL = 10  # SGLang's Decode batch line every this many decode steps (its default is 40)


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    input_tokens: int
    output_tokens: int
    shared_prefix_tokens: int = 0  # every prompt starts with the same tokens, cached before timing starts


WORKLOADS = {
    "offline": Workload("offline_8192x256", 64, 8192, 256),
    "online": Workload("online_1024x8192", 32, 1024, 8192),
    "small": Workload("small_1024x32", 8, 1024, 32),
    # online's shape with a quarter of the decode (2048 tokens: 128 pages per request fill and compress),
    # so the three TP=2 systems fit one device call with their two-process starts.
    "medium": Workload("online_1024x2048", 32, 1024, 2048),
    # Milestone 3's paths: prompts longer than m3's 2048-token prefill chunk, sharing a cached 2048-token
    # prefix (its pages compressed), so extend reads compressed prefix pages and prefill runs in chunks.
    "prefix": Workload("prefix_3072x32", 16, 3072, 32, shared_prefix_tokens=2048),
    # The radix cache under memory pressure (milestone 3): 192 distinct 4096-token prompts, 793k tokens in all
    # against the 389k-token budget, so finished requests' cached pages must be evicted to admit the rest.
    "evict": Workload("evict_4096x32", 192, 4096, 32),
}


@dataclass(frozen=True)
class RunSpec:
    system: str
    milestone: str
    workload: Workload
    timeout_s: int | None

    @property
    def name(self) -> str:
        return f"{self.system}-{self.milestone}-{self.workload.name}"


def parse_runs(text: str) -> list[RunSpec]:
    """``SYSTEM:MILESTONE[:WORKLOAD[:TIMEOUT_S]]``, comma-separated; fails loudly on anything else."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        if not 2 <= len(parts) <= 4:
            raise SystemExit(f"run {item!r}: want SYSTEM:MILESTONE[:WORKLOAD[:TIMEOUT_S]]")
        system, milestone, workload = parts[0], parts[1], parts[2] if len(parts) > 2 else "offline"
        if system not in SYSTEMS or milestone not in MILESTONES or workload not in WORKLOADS:
            raise SystemExit(
                f"run {item!r}: system in {SYSTEMS}, milestone in {tuple(MILESTONES)}, "
                f"workload in {tuple(WORKLOADS)}"
            )
        timeout = int(parts[3]) if len(parts) == 4 else None
        out.append(RunSpec(system, milestone, WORKLOADS[workload], timeout))
    return out


def engine_kwargs(system: str, milestone: str, model: str, budget_tokens: int) -> dict[str, Any]:
    return dict(
        model_path=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend=system,
        page_size=16,
        dtype="bfloat16",
        max_total_tokens=budget_tokens,
        mem_fraction_static=0.85,
        sampling_backend="pytorch",
        grammar_backend="none",
        log_level="info",
        random_seed=0,
        decode_log_interval=DECODE_LOG_INTERVAL,
        incremental_streaming_output=False,  # chunks carry all ids so far: the client only reads len()
        **MILESTONES[milestone],
    )

"""The router config's `placement:` section: the filters', scorers' and picker's knobs, and the wait for
headroom (docs/router.md lists each). Split from config.py, which holds the other sections and loads the
file; `zipkv.controlplane.config` re-exports it."""

from __future__ import annotations

from pydantic import Field, model_validator

from zipkv.controlplane.security_config import Strict

# bench/sim/cluster_sim.py chose it (docs/benchmarks.md, "Serving at cluster scale (simulation)").
AFFINITY_WEIGHT_DEFAULT = 1.0


class PlacementConfig(Strict):
    stale_after_ms: int = Field(
        default=1000, gt=0, description="older reports are compared on the coarse signal"
    )
    expire_after_ms: int = Field(
        default=5000, gt=0, description="workers whose reports stop are dropped after this"
    )
    reservation_ttl_s: float = Field(
        default=900.0, gt=0, description="a crashed router's reservations expire"
    )
    report_delay_bound_ms: int = Field(
        default=200, gt=0, description="longest a report takes from worker to router (reservation accounting)"
    )
    weight_headroom: float = Field(default=1.0, ge=0)
    weight_slo: float = Field(default=1.0, ge=0)
    weight_queue: float = Field(default=0.5, ge=0)
    # Priors used when a worker has no measurement yet (idle): decode step and HBM bandwidth.
    idle_itl_ms: float = Field(default=10.0, gt=0)
    decode_ms_per_gib: float = Field(default=0.25, gt=0, description="ms to read 1 GiB of KV (H200 ~4 TB/s)")
    shed_wait_over_ttft: float = Field(
        default=0.0,
        ge=0,
        description="drop a worker whose predicted prefill wait exceeds this x the request's TTFT target "
        "(0 = off): past the knee a late request only delays the ones behind it",
    )

    headroom_wait_ms: int = Field(
        default=5000,
        ge=0,
        description="a request every worker lacks headroom for waits this long at the router, placed again "
        "as reports arrive, before a 503 (0 = refuse at once); a worker queue stands in, bounded by the "
        "usual TTFT targets",
    )
    claim_headroom: bool = Field(
        default=False,
        description="a waiting request claims the worker short of the fewest tokens that no claim holds: "
        "its tokens count against that worker's headroom until it fits there, so later arrivals cannot "
        "keep taking the room it waits for (placement/headroom_wait.py). Off: in the cluster simulation "
        "it shed more requests past the knee and lowered goodput (docs/benchmarks.md)",
    )

    weight_prefix_affinity: float = Field(
        default=AFFINITY_WEIGHT_DEFAULT,
        ge=0,
        description="weight of the prefix-affinity scorer (0 = off): the fraction of the prompt's leading "
        "blocks the worker last served; at most the sum of the other weights",
    )
    prefix_block_tokens: int = Field(
        default=512, gt=0, description="tokens per hashed prompt block of the prefix index"
    )
    prefix_index_blocks: int = Field(
        default=131072,
        gt=0,
        description="prefix index entries (block hash -> worker) kept, least recently used dropped first",
    )

    @model_validator(mode="after")
    def _check(self) -> PlacementConfig:
        if self.expire_after_ms < self.stale_after_ms:
            raise ValueError("placement.expire_after_ms must be >= placement.stale_after_ms")
        if self.claim_headroom and self.reservation_ttl_s * 1000 <= self.headroom_wait_ms:
            raise ValueError(
                "placement.reservation_ttl_s must outlast placement.headroom_wait_ms: a claim is a "
                "reservation and would expire while its request still waits"
            )
        load_weights = self.weight_headroom + self.weight_slo + self.weight_queue
        if load_weights <= 0:
            raise ValueError("placement weights are all zero: give at least one scorer a positive weight")
        if self.weight_prefix_affinity > load_weights:
            raise ValueError(
                f"placement.weight_prefix_affinity ({self.weight_prefix_affinity}) exceeds the sum of the "
                f"headroom, slo and queue weights ({load_weights}): affinity alone would outrank every load "
                "signal and pile a conversation's turns on one worker; lower it"
            )
        return self

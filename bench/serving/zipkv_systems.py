"""zipkv's systems in the serving sweep: whether each compresses, and the router settings it runs with.

    zipkv               the router's defaults (controlplane/config.py)
    zipkv_uncompressed  the same with compression off (zipkv's pool and kernel, no page compressed)
    zipkv_shed          the router's SLO shed on: `placement.shed_wait_over_ttft` = 1.0, so a worker whose
                        queued prefill would take longer than the request's TTFT target (2 s by default) is
                        no candidate, and with none left the router answers 503 at once

Why `zipkv_shed`: on one H100 past the knee (2 req/s of the Mooncake trace) every system is prefill-bound,
and zipkv's default router starts what its KV room allows, each request then stalled by the prefills behind
it (docs/benchmarks.md, "after the fixes"). The simulation, validated against that run (zipkv at 2 req/s:
ITL p50 and p99 within 1%), puts zipkv's strict goodput at 1 req/s at 0.63 req/s with the shed at 1.0
against 0.33 without, refusing 12 of 96 requests; 0.25 and 0.5 refuse 34-54, 1.25 and 1.5 keep less goodput.
The router's default stays off: a team that must serve every request gets a queue, as SGLang's server gives.

serving_systems.py starts them from here, and the simulation (bench/sim/sim_validation.py) places each
with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZipkvSystem:
    compression: bool
    shed_wait_over_ttft: float = 0.0  # the router's placement.shed_wait_over_ttft (0: off, its default)

    def router_env(self) -> dict[str, str]:
        """The router's config overrides (ZIPKV_SECTION__KEY, controlplane/config.py) for this system."""
        if self.shed_wait_over_ttft <= 0:
            return {}
        return {"ZIPKV_PLACEMENT__SHED_WAIT_OVER_TTFT": repr(self.shed_wait_over_ttft)}


ZIPKV_SYSTEMS = {
    "zipkv": ZipkvSystem(compression=True),
    "zipkv_uncompressed": ZipkvSystem(compression=False),
    "zipkv_shed": ZipkvSystem(compression=True, shed_wait_over_ttft=1.0),
}

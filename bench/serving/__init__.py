"""End-to-end serving benchmarks on real engines: SGLang end to end, the serving sweep under SLO, the Ray
Serve stack, the reference engine on the GPU, one request's trace, and the Mooncake trace workload."""

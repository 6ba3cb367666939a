"""Router benchmarks: placement decision time, added latency and throughput, and the Locust load."""

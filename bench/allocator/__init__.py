"""Allocator benchmarks: equal-memory admission (the host ledger and the reference engine) and the
bookkeeping cost per decode step."""

"""Kernel benchmarks: the codec, decode attention (portable and Hopper), extend attention, their compiled
resources and Nsight Compute summaries, and the real KV they run on."""

"""zipkv.kernels: the page format, the codec and the fused decode attention kernel (torch + Triton only)."""

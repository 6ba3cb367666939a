"""The cluster simulation (SimPy): simulated SGLang workers fitted to the H200 runs, placement policies,
and its predictions beside the serving sweep's measurements."""

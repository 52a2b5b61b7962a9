"""profiler: measurement (timers, probes, ceilings, sweeps, timelines, result files) and the CLI."""

"""scripts/benchmark and the scripts/*-benchmark probes: ratios measured side by side."""

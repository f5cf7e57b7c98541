"""scripts/chaos and scripts/soak: the pipelines under injected faults, checked exactly-once."""

"""Pure rules of backlog-aware checkpointing: no pyspark, no I/O, an injected clock.

Everything else in the project depends on this package; it depends on nothing of ours.
"""

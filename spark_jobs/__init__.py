"""The Spark side: backlog-aware checkpointing for PySpark Structured Streaming jobs."""

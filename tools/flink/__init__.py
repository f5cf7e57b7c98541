"""scripts/flink-benchmark: the same pipeline on Apache Flink's HybridSource, beside ours."""

"""Loopback services the tests, demos and benchmarks start: Kafka, PostgreSQL, a Spark cluster."""

"""The demo and the benchmark: synthetic events, a live producer, summaries and charts."""

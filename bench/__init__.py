"""Benchmark harness: count_topic beside the raw Kafka read rate, in one run (``python -m bench``)."""

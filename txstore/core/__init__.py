"""The pure core: what exactly-once means, as plain functions over frozen dataclasses.

Owns offset ranges and their planning and splitting rules (:mod:`~txstore.core.ranges`),
starting rules (:mod:`~txstore.core.starting`), result addresses and exact arithmetic
(:mod:`~txstore.core.results`), event-time windows and durations
(:mod:`~txstore.core.windows`), the fingerprint of a log's last message
(:mod:`~txstore.core.fingerprint`), how ``status --check`` judges a partition
(:mod:`~txstore.core.health`), the fail points tests use (:mod:`~txstore.core.failpoints`)
and the named errors (:mod:`~txstore.core.errors`).

May import: the standard library and ``txstore.core`` only (no Kafka, PostgreSQL or Spark
client), so everything here is tested without a server. The import-linter contracts in
``pyproject.toml`` check it.
"""

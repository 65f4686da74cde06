"""The environment variables txstore reads for where Kafka and PostgreSQL are: names only, so the
command line can name them in its help without importing a client library."""

from __future__ import annotations

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
"""Kafka's bootstrap servers when ``--bootstrap-servers`` is not given."""

DATABASE_URL_ENV = "TXSTORE_DATABASE_URL"
"""The PostgreSQL URL when ``--database-url`` is not given."""

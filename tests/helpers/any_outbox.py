"""Jobs that publish their results through the outbox (``publish_topic``), on either broker."""

from __future__ import annotations

from typing import Any

from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.producers import close_producers


def publish_one_batch(spark: Any, settings: JobSettings) -> None:
    """One batch of ``settings``' job counting per key (``CountMessages(by_key=True)``), publishing
    what it commits; the outbox's producers are closed after it, also when it fails."""
    try:
        with TransactionalJob(spark, settings, CountMessages(by_key=True)) as job:
            job.run_batch()
    finally:
        close_producers()

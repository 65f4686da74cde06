"""count_topic: exactly-once message counts per topic, in ``txn_data``."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from confluent_kafka import Message

from txstore.ranges import OffsetRange
from txstore.runner import run_job_main
from txstore.sink import TOPIC_TOTAL, ResultKey


def count_messages(offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
    """The topic-total delta of one range: how many messages it holds."""
    return {TOPIC_TOTAL: sum(len(batch) for batch in batches)}


def main(argv: list[str] | None = None) -> int:
    return run_job_main(
        argv,
        prog="count_topic",
        description="Count Kafka messages per topic into PostgreSQL, exactly once.",
        default_job="count_topic",
        aggregate=count_messages,
    )


if __name__ == "__main__":
    sys.exit(main())

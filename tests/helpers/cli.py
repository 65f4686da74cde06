"""The ``txstore`` operator command, run as its own process; a job 'counter' for it to show and reset."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from tests.conftest import produce
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.core.starting import StartDecision
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.sink import TransactionalSink


def txstore(*args: str, url: str, kafka: AnyKafka | None = None) -> subprocess.CompletedProcess[str]:
    more = ["--bootstrap-servers", kafka.bootstrap_servers] if kafka else []
    return subprocess.run(
        [sys.executable, "-m", "txstore.ops.cli", args[0], "--database-url", url, *more, *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )


def count_some(database_url: str, kafka: AnyKafka, topic: str) -> str:
    produce(kafka.bootstrap_servers, topic, {0: 10, 1: 20, 2: 30})
    with connect(database_url) as conn:
        store.create_start_rows(conn, "counter", [StartDecision(topic, p, 0, "test") for p in range(3)])
        sink = TransactionalSink(conn, "counter")
        # with the log end, as a job's planned ranges have it (each commit records its backlog)
        sink.commit(OffsetRange(topic, 0, 0, 4, log_end=10), {TOPIC_TOTAL: 4})
        sink.commit(OffsetRange(topic, 1, 0, 20, log_end=20), {TOPIC_TOTAL: 20})
    return topic


def offsets(db: psycopg.Connection, topic: str) -> dict[int, int]:
    """Job 'counter's committed offsets of ``topic``, by partition."""
    return {p: o for (_, p), o in store.committed_offsets(db, "counter", [topic]).items()}

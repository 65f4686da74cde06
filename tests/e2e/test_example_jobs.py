"""The job flags and the example job as users run them: spark-submit and `python jobs/...`."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from tests.conftest import REPO, send
from tests.e2e.test_aggregates import MINUTE, expected, keyed_messages, stored
from tests.helpers.counting import BrokerDb
from tests.helpers.job_processes import count_topic_args, job_env, operator_cli, run_job, spark_submit
from tests.postgres.test_idempotent_and_outbox import published, read_topic, stored_messages
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

SUM_FIELD = str(REPO / "jobs" / "sum_field.py")


def test_spark_submit_sum_field_sums_a_json_field_per_key_exactly_once(
    broker_db: BrokerDb, tmp_path: Path
) -> None:
    topic = broker_db.new_topic(2)
    rng = random.Random(3)
    want: Counter[str | None] = Counter()
    outgoing = []
    for i in range(400):
        key = rng.choice([b"alice", b"bob", None])
        amount = Decimal(rng.randrange(1, 100_000)) / 100  # cents: exact in NUMERIC, not in floats
        outgoing.append((i % 2, key, json.dumps({"amount": float(amount), "note": "x"}).encode(), None))
        want[None if key is None else key.decode()] += amount
    bad = [b"not json", b'{"amount": "12"}', b"[1, 2]", b'{"other": 1}', b'{"amount": true}', b"\xff"]
    outgoing += [(0, b"alice", value, None) for value in bad]
    send(broker_db.kafka.bootstrap_servers, topic, outgoing)
    env = job_env(
        TXSTORE_DATABASE_URL=broker_db.database_url, KAFKA_BOOTSTRAP_SERVERS=broker_db.kafka.bootstrap_servers
    )
    for _ in range(2):  # the second run finds nothing new and adds nothing
        result = spark_submit(
            SUM_FIELD, "--topic", topic, "--field", "amount", "--once", env=env, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr[-3000:]
    rows = stored(broker_db.db, "sum_field", topic)
    assert rows.pop(("skipped", None, None)) == len(bad)
    assert rows.pop(("topic", None, None)) == sum(want.values())
    assert rows == {("key", k, None): v for k, v in want.items()}
    assert broker_db.offsets(topic, "sum_field") == broker_db.log_ends(topic)


def test_count_topic_by_key_and_window_per_batch_with_publishing_from_the_command_line(
    broker_db: BrokerDb,
) -> None:
    topic, results = broker_db.new_topic(3), broker_db.new_topic(1, prefix="results")
    messages = keyed_messages(random.Random(11), 600, 3)
    send(broker_db.kafka.bootstrap_servers, topic, messages)
    flags = ["--by", "key", "--window", "1m", "--commit", "per-batch", "--min-partitions", "5"]
    result = run_job(
        *count_topic_args(
            broker_db.kafka, broker_db.database_url, topic, *flags, "--publish-topic", results, "--once"
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert stored(broker_db.db, "count_topic", topic) == expected(messages, True, MINUTE)
    assert broker_db.offsets(topic) == broker_db.log_ends(topic)
    keys = {
        r[0]
        for r in broker_db.db.execute("SELECT dedup_key FROM txn_outbox WHERE sent_at IS NOT NULL").fetchall()
    }
    assert len(keys) == 1 and set(published(broker_db.kafka, results)) == keys


def test_count_topic_with_the_idempotent_sink_from_the_command_line(broker_db: BrokerDb) -> None:
    kafka, db, topic = broker_db.kafka, broker_db.db, broker_db.new_topic(2)
    send(kafka.bootstrap_servers, topic, [(p, b"k", b"v%d" % i, None) for i in range(30) for p in (0, 1)])
    for _ in range(2):
        result = run_job(
            *count_topic_args(kafka, broker_db.database_url, topic, "--sink", "idempotent", "--once")
        )
        assert result.returncode == 0, result.stderr[-3000:]
        db.execute("UPDATE txn_offsets SET off = 10")  # force a replay of most of it
    assert len(stored_messages(db, "count_topic")) == 60
    assert db.execute("SELECT count(*) FROM txn_data").fetchone() == (0,)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sink", "idempotent", "--by", "key"], "cannot be combined with --by or --window"),
        (["--min-partitions", "4"], "--min-partitions needs --commit per-batch"),
        (["--window", "5 fortnights"], "cannot read the duration '5 fortnights'"),
        (
            ["--sink", "idempotent", "--publish-topic", "x"],
            "takes neither --commit per-batch nor --publish-topic",
        ),
        (["--publish-topic", "x", "--publish-max-bytes", "100"], "--publish-max-bytes must be at least 4096"),
    ],
)
def test_flags_that_cannot_work_together_fail_with_one_line_before_anything_runs(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, flags: list[str], message: str
) -> None:
    result = run_job(*count_topic_args(kafka, database_url, "never-read", *flags, "--once"), timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("count_topic: error:")
    assert "Traceback" not in result.stderr
    assert db.execute("SELECT count(*) FROM txn_offsets").fetchone() == (0,)


def test_txstore_publish_sends_what_waits_in_the_outbox(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    from tests.postgres.test_sink import seed
    from txstore.core.ranges import OffsetRange
    from txstore.core.results import TOPIC_TOTAL
    from txstore.postgres.db import connect
    from txstore.postgres.sink import TransactionalSink

    results = new_topic(1, prefix="results")
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        TransactionalSink(conn, "j", publish_to=results).commit(OffsetRange("t", 0, 0, 3), {TOPIC_TOTAL: 3})
    out = operator_cli(
        "publish",
        "--job",
        "j",
        "--database-url",
        database_url,
        "--bootstrap-servers",
        kafka.bootstrap_servers,
    )
    assert out.returncode == 0, out.stderr
    assert "published 1 results of job 'j'; 0 waiting" in out.stdout
    (key,) = [(m.key() or b"").decode() for m in read_topic(kafka, results)]
    assert re.fullmatch("j/t/0/3/[0-9a-f]{32}/1", key)

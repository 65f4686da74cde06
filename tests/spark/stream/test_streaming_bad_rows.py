"""A streaming query into a results table: a row PostgreSQL refuses names its message.

``writeStream.format("txstore").option("txstore.table", ...)``: a row the table refuses (a NULL
key, a value out of range for its column or too long for it, text that is not the column's
type, a check constraint) used to stop the query with a raw psycopg error naming no message.
Now the sink finds the message among the micro-batch's rows (by bisection over its offsets, as
``jobs/aggregate.py`` does, :mod:`txstore.spark.ranges.bad_rows`) and stops in one line naming job,
micro-batch, topic, partition, offset, column and PostgreSQL's reason, nothing committed; or, with
``txstore.onBadMessage`` ``skip``, commits the rest with the offsets and records the message in
``txn_bad_messages`` in the same transaction, once, however often the micro-batch is replayed.
Real Spark, PostgreSQL and the Kafka-protocol test broker, on running queries.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from tests.conftest import send
from tests.helpers.cli import txstore as txstore_cli
from tests.helpers.counting import Counting, offsets
from tests.helpers.streams import JOB, QueryFailed
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import BadOffset
from txstore.spark.stream.stream_bad_rows import RowsByMessage, origins_of
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

ORDERS = {
    "txstore.table": "stream_orders",
    "txstore.key": "country",
    "txstore.merge": "items=sum,amount=max,ref=replace,note=replace",
}
REF = "6f1c1f0e-1d5c-4a43-9b3e-0c4d2e9e7a11"


def create_orders(db: psycopg.Connection) -> None:
    # varchar(n) is refused before anything is read (it silently cuts a string whose excess is
    # spaces, results_check.py): a domain's length check is the "too long" a table can have.
    db.execute("CREATE DOMAIN stream_note AS text CHECK (char_length(VALUE) <= 8)")
    db.execute(
        "CREATE TABLE stream_orders (country text PRIMARY KEY, items smallint, "
        "amount numeric(5,2) CHECK (amount >= 0), ref uuid, note stream_note)"
    )


def order_rows(df: Any) -> Any:
    """One row per message: key = country, value = ``items|amount|ref|note``."""

    def field(i: int) -> str:
        return f"element_at(split(CAST(value AS STRING), '[|]'), {i})"

    return df.selectExpr(
        "topic",
        "partition",
        "offset",
        "CAST(key AS STRING) AS country",
        f"CAST({field(1)} AS INT) AS items",
        f"CAST({field(2)} AS DECIMAL(12,2)) AS amount",
        f"{field(3)} AS ref",
        f"{field(4)} AS note",
    )


def orders(db: psycopg.Connection) -> dict[str, tuple[int, Decimal]]:
    rows = db.execute("SELECT country, items, amount FROM stream_orders").fetchall()
    return {country: (items, amount) for country, items, amount in rows}


GOOD_VALUE = f"1|10.50|{REF}|ok".encode()


def good_messages(per_partition: int, partitions: int) -> dict[int, list[tuple[bytes | None, bytes]]]:
    countries = (b"fr", b"de", b"it")
    return {
        p: [(countries[(i + p) % 3], GOOD_VALUE) for i in range(per_partition)] for p in range(partitions)
    }


def expected(
    messages: dict[int, list[tuple[bytes | None, bytes]]], skipped: set[tuple[int, int]]
) -> dict[str, tuple[int, Decimal]]:
    out: dict[str, tuple[int, Decimal]] = {}
    for p, kvs in messages.items():
        for i, (key, _) in enumerate(kvs):
            if (p, i) not in skipped:
                assert key is not None
                items, _ = out.get(key.decode(), (0, Decimal(0)))
                out[key.decode()] = (items + 1, Decimal("10.50"))
    return out


# Each kind of row PostgreSQL refuses: the message's key and value, the column it names, and
# PostgreSQL's reason (its error's class).
REFUSALS: dict[str, tuple[bytes | None, bytes, str, str]] = {
    "a NULL key into the primary key": (None, GOOD_VALUE, "country", "NotNullViolation"),
    "a string too long for its column": (
        b"fr",
        f"1|10.50|{REF}|far too long".encode(),
        "note",
        "CheckViolation",
    ),
    "a number out of range for smallint": (
        b"fr",
        f"40000|10.50|{REF}|ok".encode(),
        "items",
        "NumericValueOutOfRange",
    ),
    "a number out of range for numeric(5,2)": (
        b"fr",
        f"1|1234.56|{REF}|ok".encode(),
        "amount",
        "NumericValueOutOfRange",
    ),
    "text that is not the column's type": (
        b"fr",
        b"1|10.50|not-a-uuid|ok",
        "ref",
        "InvalidTextRepresentation",
    ),
    "a check constraint": (b"zz", f"1|-1.00|{REF}|ok".encode(), "amount", "CheckViolation"),
}


def produce(
    kafka: MockKafkaCluster, topic: str, messages: dict[int, list[tuple[bytes | None, bytes]]]
) -> None:
    send(kafka.bootstrap_servers, topic, [(p, k, v, None) for p, kvs in messages.items() for k, v in kvs])


def assert_nothing_committed(db: psycopg.Connection, topic: str) -> None:
    """No offset moved, no row merged, nothing recorded."""
    assert set(offsets(db, topic, job=JOB).values()) <= {0}
    assert orders(db) == {}
    assert db.execute("SELECT count(*) FROM txn_bad_messages").fetchone() == (0,)


def test_each_copy_line_keeps_its_message_so_a_piece_of_offsets_selects_exactly_its_rows() -> None:
    """The rows the search tries for a piece of offsets (RowsByMessage.of) and the rows committed
    without the bad messages (without): by each row's own message, in the tasks' order."""
    # Two rows of offset 5 (an explode), partitions interleaved, offsets not in order.
    rows = [("t", 0, 5), ("t", 1, 2), ("t", 0, 5), ("t", 0, 3), ("t", 1, 9), ("t", 0, 8)]
    batch = pa.record_batch(
        [
            pa.array([r[0] for r in rows]),
            pa.array([r[1] for r in rows], pa.int32()),
            pa.array([r[2] for r in rows]),
        ],
        names=["topic", "partition", "offset"],
    )
    text = b"".join(b"row%d\n" % i for i in range(len(rows)))
    found = RowsByMessage([((len(rows), text), origins_of(batch))])
    assert list(found.of(OffsetRange("t", 0, 4, 9))) == [(3, b"row0\nrow2\nrow5\n")]
    assert list(found.of(OffsetRange("t", 0, 5, 6))) == [(2, b"row0\nrow2\n")]
    assert list(found.of(OffsetRange("t", 1, 3, 9))) == []
    bad = [BadOffset("t", 0, 5, "why"), BadOffset("t", 1, 9, "why")]
    assert list(found.without(bad)) == [(3, b"row1\nrow3\nrow5\n")]


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_row_the_table_refuses_stops_the_query_in_one_line_naming_its_message_and_column(
    streaming: Counting, tmp_path: Path, refusal: str
) -> None:
    key, value, column, reason = REFUSALS[refusal]
    create_orders(streaming.db)
    topic = streaming.new_topic(2)
    messages = good_messages(12, 2)
    messages[1][7] = (key, value)
    produce(streaming.kafka, topic, messages)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, tmp_path / "chk", rows=order_rows, sink_options=ORDERS)
    where = f"job '{JOB}' micro-batch 0 topic '{topic}' partition 1 offset 7: "
    line = next((x for x in str(e.value).splitlines() if where in x), None)
    assert line is not None, str(e.value)
    assert f"stream_orders refused this message's row (column {column}: {reason}: " in line, line
    assert "nothing was committed" in line
    assert "fix the table or the query, or set .option('txstore.onBadMessage', 'skip')" in line, line
    assert line.endswith("record them in txn_bad_messages; then restart the query"), line
    assert "Traceback" not in line and "psycopg" not in line
    assert_nothing_committed(streaming.db, topic)


def test_skip_records_each_refused_message_once_over_a_replay_and_commits_the_rest(
    streaming: Counting, tmp_path: Path
) -> None:
    create_orders(streaming.db)
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    earlier = good_messages(3, 2)  # a first micro-batch, so that the one replayed is not the first
    messages = good_messages(20, 2)
    bad = {}  # (partition, index in messages) -> the reason's class
    for i, (k, v, _, why) in enumerate(REFUSALS.values()):
        where = (i % 2, 3 + 2 * i)
        messages[where[0]][where[1]] = (k, v)
        bad[where] = why

    def run() -> Any:
        return streaming.run_available_now(
            topic, checkpoint, rows=order_rows, sink_options={**ORDERS, "txstore.onBadMessage": "skip"}
        )

    produce(streaming.kafka, topic, earlier)
    run()
    produce(streaming.kafka, topic, messages)
    query = run()
    both = {p: earlier[p] + messages[p] for p in messages}
    skipped = {(p, i + 3) for p, i in bad}  # their offsets: after the first micro-batch's 3
    assert orders(streaming.db) == expected(both, skipped)
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)

    def recorded() -> list[tuple[str, int, int, str]]:
        return streaming.db.execute(
            "SELECT topic, part, off, reason FROM txn_bad_messages WHERE job = %s ORDER BY part, off", (JOB,)
        ).fetchall()

    first = recorded()
    assert [(t, p, o) for t, p, o, _ in first] == [(topic, p, o) for p, o in sorted(skipped)]
    assert [r.split(":", 1)[0] for *_, r in first] == [bad[k] for k in sorted(bad)]

    # The crash between the sink's PostgreSQL commit and Spark's commit log: the micro-batch
    # replays, is recognised as committed, and records nothing again.
    last_batch = max(p.batchId for p in query.recentProgress if p.numInputRows > 0)
    assert last_batch >= 1
    (checkpoint / "commits" / str(last_batch)).unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    again = run()
    assert [p for p in again.recentProgress if p.batchId == last_batch and p.numInputRows > 0]
    assert recorded() == first
    assert orders(streaming.db) == expected(both, skipped)

    # `txstore status` shows the skipped messages per partition, as for the batch job.
    status = json.loads(
        txstore_cli(
            "status", "--job", JOB, "--json", url=streaming.database_url, kafka=streaming.kafka
        ).stdout
    )
    assert [(r["partition"], r["skipped"]) for r in status] == [(0, 3), (1, 3)]

    # The next micro-batch: only the new message, merged onto the same rows.
    send(streaming.kafka.bootstrap_servers, topic, [(0, b"fr", GOOD_VALUE, None)])
    run()
    more = expected(both, skipped)
    more["fr"] = (more["fr"][0] + 1, more["fr"][1])
    assert orders(streaming.db) == more
    assert recorded() == first
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)


def test_skip_stops_in_one_line_past_the_batch_jobs_bound_and_records_nothing(
    streaming: Counting, tmp_path: Path
) -> None:
    """More than MAX_BAD_MESSAGES (100, the batch job's bound) refused in one micro-batch: not
    the messages' fault; the query stops, nothing committed or recorded."""
    create_orders(streaming.db)
    topic = streaming.new_topic(1)
    produce(streaming.kafka, topic, {0: [(b"fr", f"40000|10.50|{REF}|ok".encode())] * 110})
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(
            topic, tmp_path / "chk", rows=order_rows, sink_options={**ORDERS, "txstore.onBadMessage": "skip"}
        )
    start = f"job '{JOB}': more than 100 messages of this batch fail (the first: topic '{topic}' partition 0 offset 0 ("
    line = next((x for x in str(e.value).splitlines() if start in x), None)
    assert line is not None, str(e.value)
    assert "NumericValueOutOfRange" in line and "check the query and the table" in line
    assert_nothing_committed(streaming.db, topic)


def test_on_bad_message_takes_fail_or_skip_and_skip_only_with_a_results_table(
    streaming: Counting, tmp_path: Path
) -> None:
    create_orders(streaming.db)
    topic = streaming.new_topic(1)
    produce(streaming.kafka, topic, {0: [(b"fr", GOOD_VALUE)]})
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(
            topic, tmp_path / "a", rows=order_rows, sink_options={**ORDERS, "txstore.onBadMessage": "ignore"}
        )
    assert "option txstore.onBadMessage must be fail or skip, got 'ignore'" in str(e.value), str(e.value)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, tmp_path / "b", sink_options={"txstore.onBadMessage": "skip"})
    assert "txstore.onBadMessage skip needs txstore.table" in str(e.value), str(e.value)
    assert set(streaming.offsets(topic, job=JOB).values()) <= {0}

"""A message whose result row the table cannot store, or whose query fails, is named by its offset.

A key with a NUL byte or bytes that are not UTF-8 (``CAST(key AS STRING)``) fails the
COPY of the batch's rows; a value that is not a number fails the query (Spark's ANSI
cast). Either happens on every run: before, the job stopped with a raw PostgreSQL or
Spark error that named no message, and ``--on-bad-message skip`` was refused. Now the
job finds the message (bisection over offsets, on the failure path only) and stops in
one line naming job, topic, partition and offset, or, with ``skip``, records it in
``txn_bad_messages`` in the batch's own commit and merges the rest exactly.
Real Spark, PostgreSQL and the Kafka-protocol test broker.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from tests.conftest import send
from tests.helpers.counting import Counting
from tests.postgres.results.test_results_table import run_once, settings
from txstore import ResultsTable
from txstore.core.errors import BadMessage, TooManyBadMessages
from txstore.spark.ranges.range_task import COMMITTED

pytestmark = pytest.mark.spark

WORDS_SQL = "SELECT CAST(value AS STRING) AS word, count(*) AS n FROM batch GROUP BY 1"
NUMBERS_SQL = "SELECT CAST(key AS STRING) AS word, sum(CAST(CAST(value AS STRING) AS BIGINT)) AS n FROM batch GROUP BY 1"
WORDS = ResultsTable("words", ("word",), (("n", "sum"),))
GOOD = [b"apple", b"pear", b"plum", b"fig"]


def words_table(db: psycopg.Connection) -> None:
    db.execute("CREATE TABLE words (word text PRIMARY KEY, n bigint NOT NULL)")


def stored_words(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT word, n FROM words").fetchall())


CASES = {
    # query, each message's (key, value) by its offset in both partitions, the bad message's
    # partition, offset and value, and what its reason names
    "a NUL byte the table cannot store": (
        WORDS_SQL,
        [(None, GOOD[i % 4]) for i in range(40)],
        (1, 23, b"bad\x00word"),
        "CharacterNotInRepertoire",
    ),
    "a value the query cannot cast": (
        NUMBERS_SQL,
        [(GOOD[i % 4], str(i).encode()) for i in range(40)],
        (0, 31, b"thirty-one"),
        "CAST_INVALID_INPUT",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_message_that_cannot_be_merged_stops_the_job_in_one_line_naming_its_offset(
    counting: Counting, case: str
) -> None:
    query, messages, (bad_partition, bad_offset, bad_value), reason = CASES[case]
    words_table(counting.db)
    topic = counting.new_topic(2)
    by_partition = {p: list(messages) for p in (0, 1)}
    key, _ = by_partition[bad_partition][bad_offset]
    by_partition[bad_partition][bad_offset] = (key, bad_value)
    send(
        counting.kafka.bootstrap_servers,
        topic,
        [(p, k, v, None) for p, kvs in by_partition.items() for k, v in kvs],
    )
    with pytest.raises(BadMessage) as refused:
        run_once(
            counting.spark, settings(counting.kafka, counting.database_url, "words", topic), WORDS, query
        )
    error = refused.value
    assert (error.job, error.topic, error.partition, error.offset) == (
        "words",
        topic,
        bad_partition,
        bad_offset,
    )
    assert reason in error.reason
    line = str(error)
    assert "\n" not in line and f"partition {bad_partition} offset {bad_offset}" in line
    assert "--on-bad-message skip" in line
    # Nothing committed: no offsets moved, no rows merged.
    assert set(counting.offsets(topic, "words").values()) <= {0}
    assert stored_words(counting.db) == {}


def test_on_bad_message_skip_records_what_cannot_be_stored_and_merges_the_rest_exactly(
    counting: Counting,
) -> None:
    words_table(counting.db)
    topic = counting.new_topic(2)
    # Partition 0: a NUL byte at offset 7 and bytes that are not UTF-8 at its last offset;
    # partition 1: clean. Each partition's offsets count up from 0.
    values = {0: [GOOD[i % 4] for i in range(30)], 1: [GOOD[(i + 1) % 4] for i in range(25)]}
    values[0][7] = b"nul\x00here"
    values[0][29] = b"\xff\xfe not utf-8"
    send(
        counting.kafka.bootstrap_servers, topic, [(p, None, v, None) for p, vs in values.items() for v in vs]
    )
    s = settings(counting.kafka, counting.database_url, "words", topic, on_bad_message="skip")
    assert run_once(counting.spark, s, WORDS, WORDS_SQL) == {COMMITTED}
    good = Counter(
        v.decode() for p, vs in values.items() for i, v in enumerate(vs) if (p, i) not in {(0, 7), (0, 29)}
    )
    assert stored_words(counting.db) == dict(good)
    recorded = counting.db.execute(
        "SELECT topic, part, off, reason FROM txn_bad_messages WHERE job = 'words' ORDER BY part, off"
    ).fetchall()
    assert [(t, p, o) for t, p, o, _ in recorded] == [(topic, 0, 7), (topic, 0, 29)]
    assert all(r.startswith(("CharacterNotInRepertoire", "UntranslatableCharacter")) for *_, r in recorded)
    assert counting.offsets(topic, "words") == counting.log_ends(topic)
    # The next batch: only new messages, merged onto the same rows.
    send(counting.kafka.bootstrap_servers, topic, [(1, None, b"apple", None)])
    assert run_once(counting.spark, s, WORDS, WORDS_SQL) == {COMMITTED}
    good["apple"] += 1
    assert stored_words(counting.db) == dict(good)
    assert counting.db.execute("SELECT count(*) FROM txn_bad_messages").fetchone() == (2,)


def test_a_table_that_refuses_every_row_stops_the_search_and_records_nothing(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every message is "bad" (each try is a Spark job): past the limit the search stops and the
    # job says the table or the query is at fault, not skipping the whole topic one by one.
    import txstore.modes.results_table as mode

    monkeypatch.setattr(mode, "MAX_BAD_MESSAGES", 2)
    words_table(counting.db)
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, [(0, None, b"nul\x00%d" % i, None) for i in range(12)])
    s = settings(counting.kafka, counting.database_url, "words", topic, on_bad_message="skip")
    with pytest.raises(TooManyBadMessages) as stopped:
        run_once(counting.spark, s, WORDS, WORDS_SQL)
    line = str(stopped.value)
    assert "\n" not in line
    assert line.startswith(
        f"job 'words': more than 2 messages of this batch fail (the first: topic {topic!r} "
    )
    assert "partition 0 offset 0 (CharacterNotInRepertoire" in line
    assert counting.db.execute("SELECT count(*) FROM txn_bad_messages").fetchone() == (0,)
    assert set(counting.offsets(topic, "words").values()) <= {0}
    assert stored_words(counting.db) == {}

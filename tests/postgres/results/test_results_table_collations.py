"""Results-table columns with a collation of their own merge by that collation's equality and order.

The batch's rows go through a temporary table before the merge. Built from the columns'
types alone it had the database's default collation: a key column whose collation is
case-insensitive (non-deterministic) made every merge of ``'Apple'`` and ``'apple'`` fail,
and ``min``/``max`` of text combined a batch's rows in another order than the table's.
Real Spark, PostgreSQL (with ICU) and the Kafka-protocol test broker.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers.counting import BrokerDb, Counting
from tests.postgres.results.test_results_table import run_once, settings
from txstore import ResultsTable
from txstore.spark.ranges.range_task import COMMITTED

pytestmark = pytest.mark.spark

WORDS_SQL = "SELECT CAST(value AS STRING) AS word, count(*) AS n FROM batch GROUP BY 1"


def case_insensitive_collation(db: psycopg.Connection) -> None:
    try:
        db.execute(
            "CREATE COLLATION case_insensitive (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
    except psycopg.errors.FeatureNotSupported as e:  # a server built without ICU
        pytest.skip(f"this PostgreSQL cannot make a non-deterministic collation: {e}")


def values(counting: BrokerDb, topic: str, *words: str) -> None:
    counting.send(topic, [(0, None, w.encode(), None) for w in words])


def test_keys_equal_under_a_case_insensitive_collation_merge_into_one_row(counting: Counting) -> None:
    case_insensitive_collation(counting.db)
    counting.db.execute(
        "CREATE TABLE words (word text COLLATE case_insensitive PRIMARY KEY, n bigint NOT NULL)"
    )
    topic = counting.new_topic(1)
    table = ResultsTable("words", ("word",), (("n", "sum"),))
    s = settings(counting.kafka, counting.database_url, "words", topic)
    # Spark groups by bytes: 'Apple', 'apple' and 'APPLE' are three rows of one batch, one key here.
    values(counting, topic, "Apple", "apple", "pear", "APPLE", "apple")
    assert run_once(counting.spark, s, table, WORDS_SQL) == {COMMITTED}
    assert counting.db.execute("SELECT lower(word), n FROM words ORDER BY 1").fetchall() == [
        ("apple", 4),
        ("pear", 1),
    ]
    values(counting, topic, "aPPle", "PEAR", "plum")
    assert run_once(counting.spark, s, table, WORDS_SQL) == {COMMITTED}
    assert counting.db.execute("SELECT lower(word), n FROM words ORDER BY 1").fetchall() == [
        ("apple", 5),
        ("pear", 2),
        ("plum", 1),
    ]


def test_min_and_max_of_text_follow_the_columns_collation_within_a_batch(counting: Counting) -> None:
    # A collation that orders 'B' and 'a' the other way round from the database's default.
    default_upper_first = counting.db.execute("SELECT 'B' < 'a'").fetchone() == (True,)
    collation = '"und-x-icu"' if default_upper_first else '"C"'
    counting.db.execute(
        f"CREATE TABLE extremes (k int PRIMARY KEY, lo text COLLATE {collation}, hi text COLLATE {collation})"
    )
    words = ["a", "B", "c", "D"]
    expected = counting.db.execute(
        f"SELECT min(w COLLATE {collation}), max(w COLLATE {collation}) FROM unnest(%s::text[]) w", (words,)
    ).fetchone()
    topic = counting.new_topic(1)
    values(counting, topic, *words)
    # One row per message, all with key 1: the batch's rows are combined before the merge.
    query = "SELECT 1 AS k, CAST(value AS STRING) AS lo, CAST(value AS STRING) AS hi FROM batch"
    table = ResultsTable("extremes", ("k",), (("lo", "min"), ("hi", "max")))
    assert run_once(
        counting.spark, settings(counting.kafka, counting.database_url, "extremes", topic), table, query
    ) == {COMMITTED}
    assert counting.db.execute("SELECT lo, hi FROM extremes").fetchone() == expected

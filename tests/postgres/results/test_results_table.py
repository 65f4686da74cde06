"""Results tables of the user's own (jobs/aggregate.py, ``results_table=``), end to end.

Real Spark (local[2,4]), real PostgreSQL, the Kafka-protocol test broker. The
expected rows are computed here, independently, from the messages produced.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import REPO, Outgoing, pg_url, send
from tests.helpers.counting import BrokerDb, Counting
from tests.helpers.job_processes import count_topic_args, job_env
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore import ResultsTable, ResultsTableInvalid, TransactionalJob
from txstore.aggregate import SqlAggregate
from txstore.core.failpoints import FAILPOINTS_ENV
from txstore.job import JobSettings
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED

pytestmark = pytest.mark.spark

AGGREGATE = str(REPO / "jobs" / "aggregate.py")
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
COUNTRIES = ["DE", "FR", "NL", "PL", "ES"]

SALES = """
CREATE TABLE {name} (
    country text PRIMARY KEY,
    revenue numeric(18, 2) NOT NULL,
    orders bigint NOT NULL,
    smallest numeric(12, 2),
    largest numeric(12, 2),
    first_seen timestamptz,
    last_seen timestamptz
)
"""

SALES_SQL = """
SELECT get_json_object(CAST(value AS STRING), '$.country') AS country,
       sum(CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DECIMAL(12, 2))) AS revenue,
       count(*) AS orders,
       min(CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DECIMAL(12, 2))) AS smallest,
       max(CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DECIMAL(12, 2))) AS largest,
       min(timestamp) AS first_seen,
       max(timestamp) AS last_seen
FROM batch GROUP BY 1
"""

SALES_KEYS = ("country",)
SALES_MERGE = {
    "revenue": "sum",
    "orders": "sum",
    "smallest": "min",
    "largest": "max",
    "first_seen": "keep",
    "last_seen": "replace",
}

Sale = tuple[str, Decimal, int]  # country, amount, timestamp ms
Stored = dict[str, tuple[Decimal, int, Decimal, Decimal, datetime, datetime]]


def sales(rng: random.Random, n: int, run: int) -> list[Sale]:
    """Orders of run ``run``: amounts with cents, timestamps within the run's own hour (later runs later)."""
    start = BASE_MS + run * 3_600_000
    return [
        (rng.choice(COUNTRIES), Decimal(rng.randrange(1, 100_000)) / 100, start + rng.randrange(3_600_000))
        for _ in range(n)
    ]


def to_messages(orders: Sequence[Sale], partitions: int) -> list[Outgoing]:
    return [
        (i % partitions, None, json.dumps({"country": c, "amount": str(a)}).encode(), ts)
        for i, (c, a, ts) in enumerate(orders)
    ]


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def expected_sales(runs: Sequence[Sequence[Sale]]) -> Stored:
    """Sums and counts over everything; min and max amounts; first_seen kept from the first run that
    had the country (its earliest order), last_seen replaced by the last such run (its latest)."""
    out: Stored = {}
    for orders in runs:
        for country in {c for c, _, _ in orders}:
            mine = [(a, ts) for c, a, ts in orders if c == country]
            amounts = [a for a, _ in mine]
            revenue, count = sum(amounts, Decimal(0)), len(mine)
            low, high = min(amounts), max(amounts)
            first, last = at(min(ts for _, ts in mine)), at(max(ts for _, ts in mine))
            if country in out:
                r, n, lo, hi, f, _ = out[country]
                out[country] = (r + revenue, n + count, min(lo, low), max(hi, high), f, last)
            else:
                out[country] = (revenue, count, low, high, first, last)
    return out


def stored_sales(db: psycopg.Connection, table: str = "sales") -> Stored:
    rows = db.execute(
        f"SELECT country, revenue, orders, smallest, largest, first_seen, last_seen FROM {table}"
    ).fetchall()
    return {c: (r, n, lo, hi, f, la) for c, r, n, lo, hi, f, la in rows}


def sales_table(name: str = "sales", schema: str | None = None) -> ResultsTable:
    metadata = sa.MetaData(schema=schema)
    table = sa.Table(
        name,
        metadata,
        sa.Column("country", sa.Text, primary_key=True),
        sa.Column("revenue", sa.Numeric(18, 2), nullable=False),
        sa.Column("orders", sa.BigInteger, nullable=False),
        sa.Column("smallest", sa.Numeric(12, 2)),
        sa.Column("largest", sa.Numeric(12, 2)),
        sa.Column("first_seen", sa.DateTime(timezone=True)),
        sa.Column("last_seen", sa.DateTime(timezone=True)),
    )
    return ResultsTable.of(table, SALES_KEYS, SALES_MERGE)


@pytest.fixture
def sales_topic(broker_db: BrokerDb) -> Callable[..., tuple[str, list[Sale]]]:
    """``make(seed, n, partitions=2)``: the ``sales`` table created, and a new topic holding ``n``
    random orders (``random.Random(seed)``) spread over its partitions; the topic and the orders."""

    def make(seed: int, n: int, partitions: int = 2) -> tuple[str, list[Sale]]:
        broker_db.db.execute(SALES.format(name="sales"))
        topic = broker_db.new_topic(partitions)
        orders = sales(random.Random(seed), n, 0)
        broker_db.send(topic, to_messages(orders, partitions))
        return topic, orders

    return make


def assert_sales_stored(broker_db: BrokerDb, topic: str, runs: Sequence[Sequence[Sale]]) -> None:
    """The ``sales`` table holds exactly what the orders of ``runs`` add up to, and job 'sales'
    committed every partition of ``topic`` up to its log end."""
    assert stored_sales(broker_db.db) == expected_sales(runs)
    assert broker_db.offsets(topic, "sales") == broker_db.log_ends(topic)


def settings(kafka: AnyKafka, database_url: str, job: str, topic: str, **more: Any) -> JobSettings:
    return JobSettings(job, (topic,), kafka.bootstrap_servers, database_url, **more)


def run_once(spark: Any, s: JobSettings, table: ResultsTable, query: str = SALES_SQL) -> set[str]:
    with TransactionalJob(spark, s, dataframe_aggregate=SqlAggregate(query), results_table=table) as job:
        return {r.outcome for r in job.run_batch().ranges}


def test_sums_counts_min_max_and_first_and_last_seen_stay_exact_over_runs_retries_and_lost_acks(
    any_counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    any_counting.db.execute(SALES.format(name="sales"))
    topic = any_counting.new_topic(3)
    rng = random.Random(20261122)
    s = any_counting.settings("sales", topic)
    runs: list[list[Sale]] = []
    # Run 1 plain; run 2 rolls back its first commit (the retry commits); run 3 commits,
    # then the acknowledgement is lost (the retry finds it committed).
    for run, failpoint in enumerate((None, "before-commit@first", "after-commit@first")):
        orders = sales(rng, 400, run)
        any_counting.send(topic, to_messages(orders, 3))
        runs.append(orders)
        if failpoint:
            monkeypatch.setenv(FAILPOINTS_ENV, failpoint)
        else:
            monkeypatch.delenv(FAILPOINTS_ENV, raising=False)
        outcomes = run_once(any_counting.spark, s, sales_table())
        assert outcomes == ({ALREADY_COMMITTED} if run == 2 else {COMMITTED}), run
        assert stored_sales(any_counting.db) == expected_sales(runs), run
        assert any_counting.offsets(topic, "sales") == any_counting.log_ends(topic)
    # Nothing new: an idle batch changes nothing.
    monkeypatch.delenv(FAILPOINTS_ENV)
    assert run_once(any_counting.spark, s, sales_table()) == set()
    assert stored_sales(any_counting.db) == expected_sales(runs)


def test_a_batch_run_again_after_it_committed_leaves_the_table_as_it_was(
    counting: Counting, sales_topic: Callable[..., tuple[str, list[Sale]]]
) -> None:
    topic, orders = sales_topic(3, 300)
    s = counting.settings("sales", topic, metrics_port=0)
    aggregate = SqlAggregate(SALES_SQL)
    with TransactionalJob(
        counting.spark, s, dataframe_aggregate=aggregate, results_table=sales_table()
    ) as job:
        job.check_query()
        ranges = job.plan()
        assert {r.outcome for r in job.execute(ranges).ranges} == {COMMITTED}
        before = stored_sales(counting.db)
        # The same planned batch again (a retried batch after a lost acknowledgement, or a
        # second instance that planned it too): recognised, nothing merged twice.
        assert {r.outcome for r in job.execute(ranges).ranges} == {ALREADY_COMMITTED}
        # Metrics as for every per-batch commit: messages once, both driver commits timed.
        sample = job.metrics.registry.get_sample_value  # type: ignore[attr-defined]
        assert sample("txstore_messages_total", {"job": "sales", "topic": topic}) == 300
        assert sample("txstore_commit_duration_seconds_count", {"job": "sales"}) == 2
        assert sample("txstore_commit_conflicts_total", {"job": "sales", "kind": "already_committed"}) == 2
    assert stored_sales(counting.db) == before == expected_sales([orders])


def test_a_schema_qualified_table_takes_the_rows(
    counting: Counting, sales_topic: Callable[..., tuple[str, list[Sale]]]
) -> None:
    counting.db.execute("CREATE SCHEMA reporting")
    counting.db.execute(SALES.format(name="reporting.sales"))
    topic, orders = sales_topic(4, 200)  # makes "sales": the same name on the search path stays empty
    assert run_once(counting.spark, counting.settings("r", topic), sales_table(schema="reporting")) == {
        COMMITTED
    }
    assert stored_sales(counting.db, "reporting.sales") == expected_sales([orders])
    assert stored_sales(counting.db) == {}


def test_rows_with_the_same_key_in_one_batch_merge_by_their_rules_in_output_order(
    counting: Counting,
) -> None:
    counting.db.execute(
        "CREATE TABLE per_key (k text PRIMARY KEY, n bigint, lo bigint, hi bigint, latest bigint, first bigint)"
    )
    topic = counting.new_topic(1)
    counting.send(topic, [(0, None, str(v).encode(), None) for v in (5, 3, 9, 4)])
    # One row per message, all with key 'a', in offset order: no GROUP BY in the query.
    query = (
        "SELECT 'a' AS k, CAST(1 AS BIGINT) AS n, CAST(CAST(value AS STRING) AS BIGINT) AS lo, "
        "CAST(CAST(value AS STRING) AS BIGINT) AS hi, CAST(CAST(value AS STRING) AS BIGINT) AS latest, "
        "CAST(CAST(value AS STRING) AS BIGINT) AS first FROM batch ORDER BY offset"
    )
    table = ResultsTable(
        "per_key",
        ("k",),
        (("n", "sum"), ("lo", "min"), ("hi", "max"), ("latest", "replace"), ("first", "keep")),
    )
    assert run_once(counting.spark, counting.settings("dups", topic), table, query) == {COMMITTED}
    assert counting.db.execute("SELECT k, n, lo, hi, latest, first FROM per_key").fetchall() == [
        ("a", 4, 3, 9, 4, 5)
    ]
    counting.send(topic, [(0, None, b"7", None)])
    assert run_once(counting.spark, counting.settings("dups", topic), table, query) == {COMMITTED}
    assert counting.db.execute("SELECT k, n, lo, hi, latest, first FROM per_key").fetchall() == [
        ("a", 5, 3, 9, 7, 5)
    ]


def by_country(frame: Any) -> Any:
    """The sales query as a library DataFrame aggregate: ``spark.sql`` with the batch as a named
    DataFrame argument (its own temporary view, so concurrent jobs in one session never mix)."""
    query = SALES_SQL.replace("FROM batch", "FROM {batch}")
    return frame.sparkSession.sql(query, batch=frame)


ORDER_FREE_MERGE = {**SALES_MERGE, "first_seen": "min", "last_seen": "max"}


def totals_of(orders: Sequence[Sale]) -> Stored:
    out: Stored = {}
    for country in {c for c, _, _ in orders}:
        mine = [(a, ts) for c, a, ts in orders if c == country]
        amounts = [a for a, _ in mine]
        stamps = [ts for _, ts in mine]
        out[country] = (
            sum(amounts, Decimal(0)),
            len(mine),
            min(amounts),
            max(amounts),
            at(min(stamps)),
            at(max(stamps)),
        )
    return out


def test_two_jobs_merging_into_the_same_rows_at_once_neither_deadlock_nor_lose_anything(
    counting: Counting,
) -> None:
    counting.db.execute(SALES.format(name="sales"))
    rng = random.Random(11)
    topics = [counting.new_topic(2), counting.new_topic(2)]
    everything: list[Sale] = []
    for run, topic in enumerate(topics):
        orders = sales(rng, 600, run)
        send(counting.kafka.bootstrap_servers, topic, to_messages(orders, 2))
        everything += orders
    table = ResultsTable("sales", SALES_KEYS, tuple(ORDER_FREE_MERGE.items()))
    errors: list[BaseException] = []

    def run(job: str, topic: str) -> None:
        # Small batches: many commits of each job land while the other's are in flight.
        s = counting.settings(job, topic, max_offsets_per_batch=100)
        try:
            with TransactionalJob(
                counting.spark, s, dataframe_aggregate=by_country, results_table=table
            ) as runner:
                while runner.run_batch().ranges:
                    pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f"job{i}", t)) for i, t in enumerate(topics)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert stored_sales(counting.db) == totals_of(everything)
    for i, topic in enumerate(topics):
        assert counting.offsets(topic, f"job{i}") == counting.log_ends(topic)


def aggregate_args(kafka: AnyKafka, database_url: str, topic: str, *more: str) -> list[str]:
    return [
        *count_topic_args(kafka, database_url, topic),  # the servers and the topic, as count_topic takes them
        "--job",
        "sales",
        "--table",
        "sales",
        "--key",
        "country",
        "--merge",
        ",".join(f"{c}={r}" for c, r in SALES_MERGE.items()),
        *more,
    ]


def test_two_aggregate_processes_started_at_once_merge_each_batch_once(
    broker_db: BrokerDb, sales_topic: Callable[..., tuple[str, list[Sale]]], tmp_path: Path
) -> None:
    topic, orders = sales_topic(12, 900, partitions=3)
    query = tmp_path / "sales.sql"
    query.write_text(SALES_SQL + ";\n")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                AGGREGATE,
                *aggregate_args(broker_db.kafka, broker_db.database_url, topic, "--sql-file", str(query)),
            ],
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=500) for p in processes]
    # Either both succeed (one merged, the other found the batch committed) or the later one
    # is refused as an overlap; never is a batch merged twice.
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0 or "overlap" in err, err
    assert any(p.returncode == 0 for p in processes)
    assert_sales_stored(broker_db, topic, [orders])


def test_a_million_result_rows_stream_into_the_table_without_growing_the_driver(
    counting: Counting,
) -> None:
    counting.db.execute("CREATE TABLE hits (id bigint PRIMARY KEY, hits bigint NOT NULL, last_offset bigint)")
    topic = counting.new_topic(2)
    # Each message becomes half a million rows, one per id of its partition's half: a
    # message in each partition per run, so each run's result is a million rows, every id once.
    query = (
        "SELECT n AS id, CAST(1 AS BIGINT) AS hits, offset AS last_offset FROM batch LATERAL VIEW "
        "explode(sequence(partition * 500000 + CAST(1 AS BIGINT), (partition + 1) * CAST(500000 AS BIGINT))) s AS n"
    )
    table = ResultsTable("hits", ("id",), (("hits", "sum"), ("last_offset", "replace")))
    s = counting.settings("million", topic)
    peak = [0]
    stop = threading.Event()

    def watch_memory() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.05)

    for run in range(2):
        counting.send(topic, [(0, None, b"x", None), (1, None, b"x", None)])
        with TransactionalJob(
            counting.spark, s, dataframe_aggregate=SqlAggregate(query), results_table=table
        ) as job:
            job.check_query()
            before = resident_bytes()
            peak[0] = before
            watcher = threading.Thread(target=watch_memory)
            watcher.start()
            started = time.monotonic()
            try:
                report = job.run_batch()
            finally:
                stop.set()
                watcher.join()
                stop.clear()
            seconds = time.monotonic() - started
        assert {r.outcome for r in report.ranges} == {COMMITTED}
        row = counting.db.execute(
            "SELECT count(*), sum(hits), min(hits), max(hits), min(last_offset) FROM hits"
        ).fetchone()
        assert row == (1_000_000, 1_000_000 * (run + 1), run + 1, run + 1, run)
        # A million rows held at once as Python tuples would take well over 100 MB.
        grown = (peak[0] - before) / 2**20
        print(f"batch {run + 1}: {seconds:.1f} s, driver grew {grown:.0f} MB")
        assert grown < 60, f"the driver grew by {grown:.0f} MB while merging a million rows"


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def refusal(spark: Any, s: JobSettings, table: ResultsTable, query: str) -> list[str]:
    with (
        TransactionalJob(spark, s, dataframe_aggregate=SqlAggregate(query), results_table=table) as job,
        pytest.raises(ResultsTableInvalid) as raised,
    ):
        job.run_batch()
    return list(raised.value.problems)


def test_every_validation_problem_is_one_line_naming_its_column_before_anything_is_read(
    counting: Counting,
) -> None:
    topic = counting.new_topic(1)
    counting.send(topic, [(0, None, b"{}", None)])
    s = counting.settings("checks", topic)
    counting.db.execute(
        "CREATE TABLE bad (id bigint NOT NULL, day date NOT NULL, amount text, total numeric, flag boolean, "
        "gen bigint GENERATED ALWAYS AS (id * 2) STORED, UNIQUE (id))"
    )
    query = (
        "SELECT CAST(1 AS BIGINT) AS id, current_date() AS day, CAST(1.5 AS DECIMAL(10, 2)) AS amount, "
        "CAST(1 AS DOUBLE) AS total, true AS flag, 'x' AS extra, CAST(1 AS BIGINT) AS gen FROM batch"
    )
    merge = (("amount", "sum"), ("total", "avg"), ("flag", "max"), ("missing", "max"), ("gen", "max"))
    assert refusal(counting.spark, s, ResultsTable("bad", ("id", "day"), merge), query) == [
        "--merge total=avg: unknown rule 'avg'; rules: sum, min, max, replace, keep",
        "--merge missing=max: bad has no column missing",
        "--merge missing=max: the query has no column missing (it has id, day, amount, total, flag, extra, gen)",
        "query column extra: neither a --key nor in --merge; give its rule (--merge extra=sum, min, max, "
        "replace or keep) or leave it out of the query",
        "column amount: the query's amount is decimal(10,2), which bad.amount (text) cannot hold; "
        "cast it in the query or change the column",
        "--merge amount=sum: bad.amount is text; sum needs a number column",
        "column total: the query's total is double, which bad.total (numeric) cannot hold; "
        "cast it in the query or change the column",
        "--merge flag=max: bad.flag is boolean; max needs an ordered type (PostgreSQL has no max() for bool)",
        "column gen: bad.gen is a generated column; it cannot be written",
        "--key id,day: bad has no primary key or unique constraint over exactly (id, day) "
        "(it has: unique (id)); rows could not be merged by key",
    ]
    ok_query = "SELECT CAST(1 AS BIGINT) AS id, CAST(2 AS BIGINT) AS n FROM batch"
    assert refusal(counting.spark, s, ResultsTable("nowhere", ("id",), (("n", "sum"),)), ok_query) == [
        "--table nowhere: no such table (txstore never creates it: create it with your own migration, "
        "or check the name and schema)"
    ]
    counting.db.execute("CREATE TABLE nullable_key (id bigint UNIQUE, n bigint)")
    assert refusal(counting.spark, s, ResultsTable("nullable_key", ("id",), (("n", "sum"),)), ok_query) == [
        "--key id: key column id of nullable_key may be NULL and its unique constraint treats NULLs as "
        "distinct, so rows with a NULL key would never merge; make it NOT NULL (or the constraint "
        "UNIQUE NULLS NOT DISTINCT)"
    ]
    counting.db.execute("CREATE VIEW a_view AS SELECT 1::bigint AS id, 1::bigint AS n")
    assert refusal(counting.spark, s, ResultsTable("a_view", ("id",), (("n", "sum"),)), ok_query)[0] == (
        "--table a_view: not a table (relkind v); give a table to merge into"
    )
    [line] = refusal(
        counting.spark, s, ResultsTable("bad", ("id",), (("n", "sum"),)), "SELECT nope FROM batch"
    )
    assert line.startswith("query: Spark cannot run it: [UNRESOLVED_COLUMN"), line
    # Nothing was planned, read or written: the job has no offsets at all.
    assert counting.db.execute("SELECT count(*) FROM txn_offsets WHERE job = 'checks'").fetchone() == (0,)


def test_a_role_that_may_not_write_the_table_is_refused_in_one_line(
    counting: Counting,
) -> None:
    topic = counting.new_topic(1)
    role = f"results_reader_{os.getpid()}"
    counting.db.execute(SALES.format(name="sales"))
    # With a password: a server that trusts only its superuser from loopback (CI's) asks for one.
    password = f"pw-{os.getpid()}"
    counting.db.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        counting.db.execute(f"GRANT SELECT ON alembic_version TO {role}")
        counting.db.execute(
            f"GRANT SELECT, INSERT, UPDATE ON txn_offsets, txn_data, txn_lost_ranges, txn_subscriptions TO {role}"
        )
        counting.db.execute(f"GRANT SELECT ON sales TO {role}")
        s = settings(counting.kafka, pg_url(counting.db.info.dbname, role, password), "checks", topic)
        assert refusal(counting.spark, s, sales_table(), SALES_SQL) == [
            f"--table sales: role {role} lacks INSERT, UPDATE on it (GRANT SELECT, INSERT, UPDATE ON sales TO ...)"
        ]
    finally:
        counting.db.execute(f"DROP OWNED BY {role}")
        counting.db.execute(f"DROP ROLE {role}")


def test_the_aggregate_command_exits_2_with_a_line_per_problem_and_writes_nothing(
    broker_db: BrokerDb,
) -> None:
    broker_db.db.execute(SALES.format(name="sales"))
    topic = broker_db.new_topic(1)
    broker_db.send(topic, [(0, None, b'{"country": "DE", "amount": "1"}', None)])
    query = SALES_SQL.replace("count(*) AS orders", "count(*) AS n")
    args = aggregate_args(broker_db.kafka, broker_db.database_url, topic, "--sql", query)
    args[args.index("--merge") + 1] += ",revenue=median"
    result = subprocess.run(
        [sys.executable, AGGREGATE, *args], env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("aggregate: error:")]
    assert errors == [
        "aggregate: error: --merge revenue: named twice",
        "aggregate: error: --merge revenue=median: unknown rule 'median'; rules: sum, min, max, replace, keep",
        "aggregate: error: --merge orders=sum: the query has no column orders (it has country, revenue, n, "
        "smallest, largest, first_seen, last_seen)",
        "aggregate: error: query column n: neither a --key nor in --merge; give its rule (--merge n=sum, min, "
        "max, replace or keep) or leave it out of the query",
    ]
    assert stored_sales(broker_db.db) == {}
    assert broker_db.db.execute("SELECT count(*) FROM txn_offsets").fetchone() == (0,)


@pytest.mark.connect
def test_sql_results_merge_exactly_under_spark_connect(spark_connect: Any, broker_db: BrokerDb) -> None:
    broker_db.db.execute(SALES.format(name="sales"))
    topic = broker_db.new_topic(2)
    rng = random.Random(21)
    s = broker_db.settings("sales", topic)
    runs: list[list[Sale]] = []
    for run in range(2):
        orders = sales(rng, 300, run)
        broker_db.send(topic, to_messages(orders, 2))
        runs.append(orders)
        assert run_once(spark_connect, s, sales_table()) == {COMMITTED}
        assert_sales_stored(broker_db, topic, runs)


@pytest.mark.parametrize("problem", ["unreadable", "empty"])
def test_an_unreadable_or_empty_query_exits_2_in_one_line_before_anything_is_read(
    broker_db: BrokerDb, tmp_path: Path, problem: str
) -> None:
    query = tmp_path / "query.sql"
    if problem == "empty":
        query.write_text("  \n")
    args = aggregate_args(broker_db.kafka, broker_db.database_url, "sales-events", "--sql-file", str(query))
    result = subprocess.run(
        [sys.executable, AGGREGATE, *args], env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("aggregate: error:")]
    expected = (
        f"aggregate: error: --sql-file {query}: cannot read it (No such file or directory)"
        if problem == "unreadable"
        else f"aggregate: error: --sql-file {query}: the query is empty"
    )
    assert errors == [expected]
    assert broker_db.db.execute("SELECT count(*) FROM txn_offsets").fetchone() == (0,)


def aggregate_flags(*given: str) -> dict[str, Any]:
    """What ``jobs/aggregate.py`` would give TransactionalJob for these flags (its own parser)."""
    import argparse

    from txstore.aggregate import add_aggregate_options, results_job_options

    parser = argparse.ArgumentParser()
    add_aggregate_options(parser)
    keys = ["--table", "sales", "--key", "country", "--merge"]
    merge = ",".join(f"{c}={r}" for c, r in SALES_MERGE.items())
    return dict(results_job_options(parser.parse_args([*keys, merge, "--sql", SALES_SQL, *given])))


def test_read_columns_give_the_query_only_those_columns_and_the_same_rows(
    counting: Counting, sales_topic: Callable[..., tuple[str, list[Sale]]]
) -> None:
    topic, orders = sales_topic(23, 200)
    options = aggregate_flags("--read-columns", "value, timestamp")
    assert options["read_columns"] == ("value", "timestamp")

    with TransactionalJob(counting.spark, counting.settings("sales", topic), **options) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}

    assert_sales_stored(counting, topic, [orders])


def test_read_columns_that_leave_out_what_the_query_uses_are_refused_in_one_line(
    counting: Counting, sales_topic: Callable[..., tuple[str, list[Sale]]]
) -> None:
    topic, _ = sales_topic(24, 5, partitions=1)
    with pytest.raises(ResultsTableInvalid) as raised:
        aggregate_flags("--read-columns", "value,payload")
    assert list(raised.value.problems) == [
        "--read-columns: 'payload' is not a Kafka-source column; choose from key, value, topic, "
        "partition, offset, timestamp, timestampType, headers"
    ]

    options = aggregate_flags("--read-columns", "value")  # the query also uses timestamp
    s = counting.settings("sales", topic)
    with TransactionalJob(counting.spark, s, **options) as job, pytest.raises(ResultsTableInvalid) as raised:
        job.run_batch()
    [line] = raised.value.problems
    assert line.startswith("query: Spark cannot run it: ")
    assert "`timestamp`" in line
    assert line.endswith("; it reads only value: add the columns it uses")
    assert counting.offsets(topic, "sales") == {}


def test_columns_that_would_round_the_querys_numbers_are_refused_before_anything_is_read(
    counting: Counting,
) -> None:
    """Issue 24's own numbers: a count summed onto a counter at 2^24 in ``real`` (ten one-message
    batches stored 16777216, not 16777226), 0.050 summed in ``numeric(10,1)``, the bigint
    9007199254740993 in ``double precision``. Refused, one line each, before anything is read;
    with the columns the lines' ``ALTER TABLE`` gives, the same batches store them exactly."""
    counting.db.execute(
        "CREATE TABLE counters (id text PRIMARY KEY, n real NOT NULL, amount numeric(10, 1), "
        "big double precision)"
    )
    counting.db.execute("INSERT INTO counters VALUES ('c', 16777216, 0, 0)")
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, [(0, None, b"x", None)] * 10)
    query = (
        "SELECT 'c' AS id, count(*) AS n, sum(CAST('0.050' AS DECIMAL(10, 3))) AS amount, "
        "max(CAST(9007199254740993 AS BIGINT)) AS big FROM batch"
    )
    table = ResultsTable("counters", ("id",), (("n", "sum"), ("amount", "sum"), ("big", "max")))
    s = counting.settings("counters", topic, max_offsets_per_batch=1)
    lines = refusal(counting.spark, s, table, query)
    assert [line[line.index("column ") :] for line in lines] == [
        "column n: the query's n is bigint, which counters.n (real) cannot hold exactly: real holds integers "
        "exactly only up to 2^24 = 16777216, larger ones and sums round; "
        "ALTER TABLE counters ALTER COLUMN n TYPE bigint",
        "column amount: the query's amount is decimal(20,3), which counters.amount (numeric(10,1)) cannot "
        "hold exactly: numeric(10,1) rounds to 1 decimal place, the query's values have 3; "
        "ALTER TABLE counters ALTER COLUMN amount TYPE numeric(20,3)",
        "column big: the query's big is bigint, which counters.big (double precision) cannot hold exactly: "
        "double precision holds integers exactly only up to 2^53 = 9007199254740992, larger ones and sums "
        "round; ALTER TABLE counters ALTER COLUMN big TYPE bigint",
    ]
    assert counting.offsets(topic, "counters") == {}  # nothing read, nothing written
    assert counting.db.execute("SELECT n, amount, big FROM counters").fetchall() == [(16777216, 0, 0)]

    for line in lines:
        counting.db.execute(line[line.index("ALTER TABLE ") :])
    batches = 0
    with TransactionalJob(
        counting.spark, s, dataframe_aggregate=SqlAggregate(query), results_table=table
    ) as job:
        while ranges := job.run_batch().ranges:
            assert {r.outcome for r in ranges} == {COMMITTED}
            batches += 1
    assert batches == 10
    assert counting.db.execute("SELECT n, amount, big FROM counters").fetchall() == [
        (16777226, Decimal("0.500"), 9007199254740993)
    ]


def test_a_count_too_large_for_an_integer_column_stops_the_batch_and_commits_nothing(
    counting: Counting,
) -> None:
    """The check's decision for narrower integer columns (Spark's count is bigint): accepted, because a
    value or sum they cannot hold makes PostgreSQL raise instead of rounding, so the batch stops loudly
    with nothing merged and no offset moved."""
    counting.db.execute("CREATE TABLE small (id text PRIMARY KEY, n integer NOT NULL)")
    counting.db.execute("INSERT INTO small VALUES ('c', 2147483647)")
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, [(0, None, b"x", None)])
    query = "SELECT 'c' AS id, count(*) AS n FROM batch"
    table = ResultsTable("small", ("id",), (("n", "sum"),))
    s = counting.settings("small", topic)
    with (
        TransactionalJob(
            counting.spark, s, dataframe_aggregate=SqlAggregate(query), results_table=table
        ) as job,
        pytest.raises(Exception, match="integer out of range"),  # PostgreSQL's error, in the job's line
    ):
        job.run_batch()
    assert counting.db.execute("SELECT n FROM small").fetchall() == [(2147483647,)]
    assert counting.offsets(topic, "small") == {0: 0}  # planned from 0, not moved


def test_two_instants_of_a_daylight_saving_fold_stay_two_rows_and_timestamp_without_zone_is_refused(
    counting: Counting,
) -> None:
    """Spark's session zone Europe/Berlin, whose clocks went back from 03:00 to 02:00 on 2026-10-25:
    the hours 02:00 CEST and 02:00 CET are two instants an hour apart. A ``timestamp`` (without time
    zone) column would hold both as 02:00 and merge them: refused before anything is read, one line
    saying to use ``timestamptz``; there they stay two rows."""
    counting.db.execute("CREATE TABLE hourly (hour timestamp PRIMARY KEY, n bigint NOT NULL)")
    topic = counting.new_topic(1)
    first = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)  # 02:30 CEST
    second = datetime(2026, 10, 25, 1, 30, tzinfo=timezone.utc)  # 02:30 CET, an hour later
    send(
        counting.kafka.bootstrap_servers,
        topic,
        [(0, None, b"x", int(t.timestamp() * 1000)) for t in (first, second)],
    )
    query = "SELECT date_trunc('HOUR', timestamp) AS hour, count(*) AS n FROM batch GROUP BY 1"
    table = ResultsTable("hourly", ("hour",), (("n", "sum"),))
    s = counting.settings("hourly", topic)
    zone = counting.spark.conf.get("spark.sql.session.timeZone")
    counting.spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
    try:
        [line] = refusal(counting.spark, s, table, query)
        assert line[line.index("column ") :] == (
            "column hour: the query's hour is timestamp, which hourly.hour (timestamp without time zone) "
            "cannot hold exactly: timestamp without time zone drops the instant's offset, so two instants "
            "can be one value (the two 02:30 of a daylight-saving fold); "
            "ALTER TABLE hourly ALTER COLUMN hour TYPE timestamptz"
        )
        assert counting.offsets(topic, "hourly") == {}
        counting.db.execute(line[line.index("ALTER TABLE ") :])
        assert run_once(counting.spark, s, table, query) == {COMMITTED}
    finally:
        counting.spark.conf.set("spark.sql.session.timeZone", zone)
    assert dict(counting.db.execute("SELECT hour, n FROM hourly").fetchall()) == {
        datetime(2026, 10, 25, 0, tzinfo=timezone.utc): 1,
        datetime(2026, 10, 25, 1, tzinfo=timezone.utc): 1,
    }

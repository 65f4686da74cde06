"""A DataFrame aggregate that is only counts grouped by Kafka-source columns is counted in part
by the reading tasks, and stores exactly what Spark running the query as written stores.

Plan matching is pure (plans as Spark 4.3 prints them), as are the partial counts over
Arrow batches; which aggregates are pushed down is asked of classic Spark and Spark
Connect; jobs run on real Spark, PostgreSQL and the Kafka-protocol test broker, each
pushed-down job beside the same aggregate with ``push_down_counts=False``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from tests.conftest import Outgoing, send
from tests.e2e.test_aggregates import KEYS, keyed_messages, settings, stored
from tests.helpers.counting import BrokerDb, Counting
from txstore import ResultsTable
from txstore.aggregate import SqlAggregate
from txstore.core.results import decode_key
from txstore.job import TransactionalJob
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.source import pushdown as pushdown_module
from txstore.spark.source.arrow import arrow_schema
from txstore.spark.source.pushdown import (
    Count,
    PartialCount,
    final_counts,
    infer_pushdown,
    partial_count_in_plan,
    task_counts,
)

SOURCE = (
    "MapInArrow _no_rows(id#0L)#1, [key#2, value#3, topic#4, partition#5, offset#6L, timestamp#7, "
    "timestampType#8, headers#9], false"
)
RANGE = "Range (0, 1, step=1, splits=Some(1))"


def plan(aggregate: str, *below: str) -> str:
    """An optimized plan as Spark prints it: ``aggregate`` over ``below``, each a level deeper."""
    lines = [aggregate] + [("   " * depth) + "+- " + line for depth, line in enumerate(below)]
    return "\n".join(lines)


ROWS = Count(None)


def test_a_count_grouped_by_source_columns_is_pushed_down_with_its_outputs_in_order() -> None:
    found = partial_count_in_plan(
        plan(
            "Aggregate [topic#4, key#2], [topic#4, key#2, count(1) AS metric#13L]",
            "Project [topic#4, key#2]",
            SOURCE,
            RANGE,
        )
    )
    assert found == PartialCount(
        ("key", "topic"), (ROWS,), (("topic", "topic"), ("key", "key"), ("metric", ROWS))
    )
    assert found.read_columns() == ("key", "topic")
    # Without a Project (the aggregate reads every column it is given): the same.
    assert partial_count_in_plan(plan("Aggregate [topic#4], [topic#4, count(1) AS n#13L]", SOURCE, RANGE))


def test_renamed_groups_and_counts_of_a_column_keep_their_names_and_share_one_partial() -> None:
    found = partial_count_in_plan(
        plan(
            "Aggregate [partition#5, topic#4], [partition#5 AS p#20, topic#4, count(value#3) AS v#21L, "
            "count(1) AS n#22L, count(value#3) AS v2#23L]",
            "Project [topic#4, partition#5, value#3]",
            SOURCE,
            RANGE,
        )
    )
    values = Count("value")
    assert found == PartialCount(
        ("topic", "partition"),
        (values, ROWS),
        (("p", "partition"), ("topic", "topic"), ("v", values), ("n", ROWS), ("v2", values)),
    )
    assert found.read_columns() == ("value", "topic", "partition")


NOT_PUSHED = {
    "a filter": plan(
        "Aggregate [topic#4], [topic#4, count(1) AS n#13L]",
        "Project [topic#4]",
        "Filter (partition#5 < 3)",
        SOURCE,
        RANGE,
    ),
    "a sum": plan(
        "Aggregate [topic#4], [topic#4, sum(partition#5) AS n#13L]",
        "Project [topic#4, partition#5]",
        SOURCE,
        RANGE,
    ),
    "a distinct count": plan(
        "Aggregate [topic#4], [topic#4, count(distinct key#2) AS n#13L]",
        "Project [topic#4, key#2]",
        SOURCE,
        RANGE,
    ),
    "a global count": plan("Aggregate [count(1) AS n#13L]", "Project [topic#4]", SOURCE, RANGE),
    "no group, as Spark prints it": plan(
        "Aggregate [], [count(1) AS n#13L]", "Project [topic#4]", SOURCE, RANGE
    ),
    "no count": plan("Aggregate [topic#4], [topic#4]", "Project [topic#4]", SOURCE, RANGE),
    "a computed group": plan(
        "Aggregate [_g#20], [_g#20 AS k#21, count(1) AS n#13L]",
        "Project [cast(key#2 as string) AS _g#20]",
        SOURCE,
        RANGE,
    ),
    "a group by headers": plan(
        "Aggregate [headers#9], [headers#9, count(1) AS n#13L]", "Project [headers#9]", SOURCE, RANGE
    ),
    "a sort above": "Sort [topic#4 ASC NULLS FIRST], true\n+- "
    + plan("Aggregate [topic#4], [topic#4, count(1) AS n#13L]", "Project [topic#4]", SOURCE, RANGE).replace(
        "\n", "\n   "
    ),
    "a count of an attribute that is not the source's": plan(
        "Aggregate [topic#4], [topic#4, count(x#41) AS n#13L]", "Project [topic#4]", SOURCE, RANGE
    ),
    "a group attribute that is not the source's": plan(
        "Aggregate [topic#41], [topic#41, count(1) AS n#13L]", "Project [topic#4]", SOURCE, RANGE
    ),
    "a name Spark quotes": plan("Aggregate [topic#4], [topic#4, count(1) AS my count#13L]", SOURCE, RANGE),
    "a shortened source": plan(
        "Aggregate [topic#4], [topic#4, count(1) AS n#13L]",
        "MapInArrow _no_rows(id#0L)#1, [key#2, value#3, topic#4, ... 5 more fields], false",
        RANGE,
    ),
    "another source": plan("Aggregate [topic#4], [topic#4, count(1) AS n#13L]", "LocalRelation [topic#4]"),
    "nothing": "",
}


@pytest.mark.parametrize("name", list(NOT_PUSHED))
def test_only_a_whole_plan_of_counts_grouped_by_source_columns_is_pushed_down(name: str) -> None:
    assert partial_count_in_plan(NOT_PUSHED[name]) is None


def messages_batch(rng: random.Random, n: int, topics: tuple[str, ...] = ("a", "b")) -> pa.RecordBatch:
    keys = [rng.choice(KEYS) for _ in range(n)]
    values = [None if rng.random() < 0.2 else b"v" for _ in range(n)]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([rng.choice(topics) for _ in range(n)]),
        ],
        schema=arrow_schema(("key", "value", "topic")),
    )


def test_partial_counts_of_any_split_of_the_messages_sum_to_the_exact_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(7)
    values = Count("value")
    partial = PartialCount(
        ("key", "topic"), (ROWS, values), (("topic", "topic"), ("key", "key"), ("n", ROWS), ("v", values))
    )
    monkeypatch.setattr(pushdown_module, "MERGE_ROWS", 40)  # merges (and hands-on) happen often
    for _ in range(20):
        batches = [messages_batch(rng, rng.randrange(0, 60)) for _ in range(rng.randrange(1, 8))]
        tasks = rng.randrange(1, 4)
        handed = [b for t in range(tasks) for b in task_counts(batches[t::tasks], partial)]
        result = final_counts(
            pa.Table.from_batches(handed, schema=pushdown_module.partial_arrow_schema(partial)), partial
        )
        assert result.column_names == ["topic", "key", "n", "v"]
        rows: Counter[tuple[str, bytes | None]] = Counter()
        valued: Counter[tuple[str, bytes | None]] = Counter()
        for batch in batches:
            for key, value, topic in zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True):
                rows[(topic, key)] += 1
                valued[(topic, key)] += value is not None
        got = {
            (t, k): (n, v)
            for t, k, n, v in zip(*(result.column(i).to_pylist() for i in range(4)), strict=True)
        }
        assert got == {g: (rows[g], valued[g]) for g in rows}  # null keys one group, like Spark's


def test_a_task_with_mostly_distinct_groups_hands_them_on_in_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pushdown_module, "MERGE_ROWS", 100)
    partial = PartialCount(("key", "topic"), (ROWS,), (("topic", "topic"), ("key", "key"), ("n", ROWS)))
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([b"k%d" % (i * 30 + j) for j in range(30)]), pa.array(["t"] * 30)],
            schema=arrow_schema(("key", "topic")),
        )
        for i in range(20)
    ]
    handed = list(task_counts(batches, partial))
    assert len(handed) > 1 and max(b.num_rows for b in handed) < 200
    assert sum(b.num_rows for b in handed) == 600  # every key once: nothing merged away or lost


WIDE_GROUPS = """
import sys
import pyarrow as pa
from txstore.spark.source.arrow import arrow_schema
from txstore.spark.source.pushdown import Count, PartialCount, task_counts

width, per_batch, batches = (int(a) for a in sys.argv[1:])
rows = Count(None)
partial = PartialCount(("key", "topic"), (rows,), (("topic", "topic"), ("key", "key"), ("n", rows)))
pad = b"x" * (width - 8)


def messages():
    for b in range(batches):
        keys = [(b * per_batch + i).to_bytes(8, "big") + pad for i in range(per_batch)]
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(["t"] * per_batch)], schema=arrow_schema(("key", "topic"))
        )


handed = largest = groups = 0
for batch in task_counts(messages(), partial):
    handed += 1
    largest = max(largest, batch.nbytes)
    groups += batch.num_rows
print(handed, largest, groups, pa.default_memory_pool().max_memory())
"""


@pytest.mark.slow
def test_a_task_counting_wide_distinct_groups_hands_them_on_within_a_byte_budget() -> None:
    # 8 KiB keys, each its own group: far fewer rows than MERGE_ROWS, yet many times the byte
    # budget in all. A task must hand its counts on by bytes too, or it holds every group (an
    # audit's task reached 9.3 GB and failed in Arrow). Measured in a process of its own: the
    # peak of Arrow's memory pool.
    import subprocess
    import sys

    budget = pushdown_module.MERGE_BYTES
    width, per_batch = 8192, 512  # 4 MiB of keys a batch
    batches = 16 * budget // (width * per_batch)
    out = subprocess.run(
        [sys.executable, "-c", WIDE_GROUPS, str(width), str(per_batch), str(batches)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    handed, largest, groups, peak = (int(n) for n in out.split())
    assert groups == batches * per_batch  # every group once: nothing merged away or lost
    assert handed > 1 and largest <= budget + width * per_batch
    # The held counts, Arrow's hash grouping of them and the piece handed on: about five times
    # the budget whatever the task's total (held by rows alone: more than the sixteen times fed).
    assert peak < 8 * budget, f"Arrow held {peak / 2**20:.0f} MiB for a {budget / 2**20:.0f} MiB budget"


def test_counts_handed_back_with_large_strings_or_another_time_zone_are_summed_alike() -> None:
    # What Spark's toArrow gives may use large string and binary types and the session's time zone.
    rows = Count(None)
    partial = PartialCount(
        ("key", "topic", "timestamp"), (rows,), (("topic", "topic"), ("key", "key"), ("n", rows))
    )
    instant = pa.array([1_767_225_600_000_000, 1_767_225_600_000_000], pa.timestamp("us", tz="UTC"))
    spark_like = pa.table(
        {
            "key": pa.array([b"k", b"k"], pa.large_binary()),
            "topic": pa.array(["t", "t"], pa.large_string()),
            "timestamp": instant.cast(pa.timestamp("us", tz="America/New_York")),
            rows.partial: pa.array([2, 3], pa.int64()),
        }
    )
    result = final_counts(spark_like, partial)
    assert result.to_pylist() == [{"topic": "t", "key": b"k", "n": 5}]


AGGREGATES: dict[str, tuple[Callable[[Any], Any], str | None]] = {
    # SQL text, not pyspark.sql.functions: the same on classic and Connect in one process.
    "per topic": (
        lambda f: f.groupBy("topic").count().selectExpr("topic", "`count` AS metric"),
        "count(1) grouped by topic",
    ),
    "per key": (
        lambda f: f.groupBy("topic", "key").agg({"*": "count"}).withColumnRenamed("count(1)", "metric"),
        "count(1) grouped by key, topic",
    ),
    "values per partition": (
        lambda f: (
            f.groupBy("topic", "partition")
            .agg({"value": "count"})
            .withColumnRenamed("count(value)", "metric")
        ),
        "count(value) grouped by topic, partition",
    ),
    "SQL per key": (
        SqlAggregate("SELECT topic, key, count(*) AS metric FROM batch GROUP BY key, topic"),
        "count(1) grouped by key, topic",
    ),
    "per key and minute": (
        lambda f: (
            f.selectExpr("topic", "key", "window(timestamp, '1 minute').start AS window_start")
            .groupBy("topic", "key", "window_start")
            .count()
        ),
        None,
    ),
    "a filter": (lambda f: f.where("partition < 3").groupBy("topic").count(), None),
    "a sum": (lambda f: f.groupBy("topic").agg({"partition": "sum"}), None),
    "a distinct count": (lambda f: f.selectExpr("topic", "key").distinct().groupBy("topic").count(), None),
    "an order": (lambda f: f.groupBy("topic").count().orderBy("topic"), None),
    "does not analyse": (lambda f: f.groupBy("no_such_column").count(), None),
}


@pytest.mark.spark
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_which_aggregates_the_reading_tasks_count(any_spark: Any, name: str) -> None:
    aggregate, want = AGGREGATES[name]
    found = infer_pushdown(any_spark, aggregate, None)
    assert (found.partial.describe() if found.partial else None) == want, found.reason
    assert found.reason


def per_key(frame: Any) -> Any:
    return frame.groupBy("topic", "key").count().withColumnRenamed("count", "metric")


def values_per_key(frame: Any) -> Any:
    return frame.groupBy("topic", "key").agg({"value": "count"}).withColumnRenamed("count(value)", "metric")


@pytest.mark.spark
@pytest.mark.parametrize("aggregate", [per_key, values_per_key], ids=["rows", "values"])
def test_a_pushed_down_job_stores_what_spark_running_the_query_stores(
    any_spark: Any, broker_db: BrokerDb, aggregate: Callable[[Any], Any]
) -> None:
    topic = broker_db.new_topic(3)
    rng = random.Random(23)
    messages: list[Outgoing] = [
        (p, k, None if rng.random() < 0.3 else v, ts) for p, k, v, ts in keyed_messages(rng, 900, 3)
    ]
    send(broker_db.kafka.bootstrap_servers, topic, messages)
    jobs = {"pushed": True, "as-written": False}
    for name, push in jobs.items():
        # min_partitions: ranges cut into pieces, several tasks per partition.
        s = settings(
            broker_db.kafka, broker_db.database_url, name, topic, commit="per-batch", min_partitions=5
        )
        with TransactionalJob(any_spark, s, dataframe_aggregate=aggregate, push_down_counts=push) as job:
            assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
            assert (job.pushdown is not None) == push
            assert not job.run_batch().ranges  # nothing new: nothing counted twice
    want: Counter[tuple[str, str | None, None]] = Counter()
    for _, key, value, _ in messages:
        want[("key", decode_key(key) if key is not None else None, None)] += (
            1 if aggregate is per_key or value is not None else 0
        )
    expected = {k: Decimal(v) for k, v in want.items() if v or aggregate is per_key}
    pushed, written = stored(broker_db.db, "pushed", topic), stored(broker_db.db, "as-written", topic)
    assert {k: v for k, v in pushed.items() if v} == expected
    assert pushed == written
    assert (
        broker_db.offsets(topic, "pushed")
        == broker_db.offsets(topic, "as-written")
        == broker_db.log_ends(topic)
    )


@pytest.mark.spark
def test_a_results_table_of_counts_per_key_is_merged_exactly_when_pushed_down(counting: Counting) -> None:
    topic, db = counting.new_topic(2), counting.db
    db.execute("CREATE TABLE key_counts (topic text, key bytea, n bigint NOT NULL, PRIMARY KEY (topic, key))")
    db.commit()
    table = ResultsTable.of(
        sa.Table(
            "key_counts",
            sa.MetaData(),
            sa.Column("topic", sa.Text, primary_key=True),
            sa.Column("key", sa.LargeBinary, primary_key=True),
            sa.Column("n", sa.BigInteger, nullable=False),
        ),
        ("topic", "key"),
        {"n": "sum"},
    )
    rng = random.Random(5)
    want: Counter[tuple[str, bytes]] = Counter()
    query = SqlAggregate("SELECT topic, key, count(*) AS n FROM batch GROUP BY topic, key")
    for run in range(2):
        messages = [(p, k or b"none", v, ts) for p, k, v, ts in keyed_messages(rng, 400, 2)]
        send(counting.kafka.bootstrap_servers, topic, messages)
        want.update((topic, k) for _, k, _, _ in messages)
        s = settings(counting.kafka, counting.database_url, "key-counts", topic)
        with TransactionalJob(counting.spark, s, dataframe_aggregate=query, results_table=table) as job:
            assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}, run
            assert job.pushdown is not None and job.pushdown.describe() == "count(1) grouped by key, topic"
    rows = db.execute("SELECT topic, key, n FROM key_counts").fetchall()
    assert {(t, bytes(k)): n for t, k, n in rows} == dict(want)


def test_jobs_aggregate_pushes_counts_down_unless_told_not_to() -> None:
    from tests.postgres.results.test_results_table import aggregate_flags

    assert "push_down_counts" not in aggregate_flags()  # the job's default: pushed down
    assert aggregate_flags("--no-push-down-counts")["push_down_counts"] is False

"""A DataFrame aggregate without read_columns reads only the columns its optimized plan uses.

The plan reading is pure (plans as Spark 4.3 prints them); the inference runs on
classic Spark and on Spark Connect; a job without read_columns stores exact
results from only the columns it inferred, on real Spark, PostgreSQL and the
Kafka-protocol test broker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from tests.e2e.test_aggregates import assert_stored, columns_seen, keyed_topic, settings
from tests.helpers.counting import Counting
from txstore.core.results import decode_key
from txstore.job import TransactionalJob
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS
from txstore.spark.source.used_columns import columns_in_plan, infer_read_columns, optimized_section
from txstore.testing.mock_kafka import MockKafkaCluster

SOURCE = (
    "MapInArrow _no_rows(id#0L)#1, [key#2, value#3, topic#4, partition#5, offset#6L, timestamp#7, "
    "timestampType#8, headers#9], false"
)


def plan(*lines: str) -> str:
    return "\n".join(lines)


def test_the_plan_names_the_columns_used_above_the_source_in_the_sources_order() -> None:
    counted = plan(
        "Aggregate [topic#4, _groupingexpression#41], [topic#4, sum(length(key#2)) AS s#40L]",
        "+- Project [key#2, topic#4, cast(value#3 as string) AS _groupingexpression#41]",
        "   +- " + SOURCE,
        "      +- Range (0, 1, step=1, splits=Some(1))",
    )
    assert columns_in_plan(counted) == ("key", "value", "topic")
    offsets_only = plan("Aggregate [offset#6L], [offset#6L, count(1) AS c#10L]", "+- " + SOURCE)
    assert columns_in_plan(offsets_only) == ("offset",)  # an id with Spark's L suffix
    assert columns_in_plan(plan("Aggregate [], [count(1) AS c#10L]", "+- " + SOURCE)) == ()


def test_an_id_that_only_begins_like_a_columns_id_does_not_count_as_that_column() -> None:
    # topic is #4; #41 and #40L are other attributes: key and value stay unused.
    text = plan("Aggregate [topic#4, x#41], [topic#4, count(1) AS c#40L]", "+- " + SOURCE)
    assert columns_in_plan(text) == ("topic",)


def test_every_column_a_distinct_compares_is_used() -> None:
    text = plan(
        "Aggregate [topic#4], [topic#4, count(1) AS count#20L]",
        "+- Aggregate [key#2, value#3, topic#4, partition#5, offset#6L, timestamp#7, timestampType#8, "
        "headers#9], [topic#4]",
        "   +- " + SOURCE,
    )
    assert columns_in_plan(text) == KAFKA_SOURCE_COLUMNS


def test_a_batch_joined_with_itself_uses_what_either_side_uses() -> None:
    other = SOURCE.replace("#2,", "#12,").replace("#4,", "#14,").replace("#5,", "#15,")
    other = other.replace("#6L", "#16L")
    text = plan(
        "Aggregate [topic#4], [topic#4, max(partition#15) AS m#30]",
        "+- Join Inner, (offset#6L = offset#16L)",
        "   :- Project [topic#4, offset#6L]",
        "   :  +- " + SOURCE,
        "   +- Project [partition#15, offset#16L]",
        "      +- " + other,
    )
    assert columns_in_plan(text) == ("topic", "partition", "offset")


def test_a_plan_that_cannot_tell_infers_nothing() -> None:
    shortened = plan("Project [topic#4, ... 30 more fields]", "+- " + SOURCE)
    assert columns_in_plan(shortened) is None
    assert columns_in_plan("Aggregate [topic#4], [topic#4]\n+- LocalRelation <empty>, [topic#4]") is None
    partial_source = SOURCE.replace(", headers#9", "")  # not the Kafka-source columns
    assert columns_in_plan(plan("Aggregate [topic#4], [topic#4]", "+- " + partial_source)) is None


def test_only_the_optimized_section_of_an_explanation_is_read() -> None:
    explained = plan(
        "== Parsed Logical Plan ==",
        "'Aggregate ['key], ['key]",
        "",
        "== Optimized Logical Plan ==",
        "Aggregate [topic#4], [topic#4]",
        "+- " + SOURCE,
        "",
        "== Physical Plan ==",
        "HashAggregate(keys=[key#2], functions=[])",
    )
    section = optimized_section(explained)
    assert section is not None and columns_in_plan(section) == ("topic",)
    assert optimized_section("== Physical Plan ==\nScan") is None


AGGREGATES: dict[str, tuple[Callable[[Any], Any], tuple[str, ...] | None]] = {
    # SQL text, not pyspark.sql.functions: the same on classic and Connect in one process.
    "per topic": (lambda f: f.groupBy("topic").count(), ("topic",)),
    "rows only": (lambda f: f.groupBy().count(), ("topic",)),
    "per key and minute": (
        lambda f: (
            f.selectExpr("topic", "key", "window(timestamp, '1 minute').start AS w")
            .groupBy("topic", "key", "w")
            .count()
        ),
        ("key", "topic", "timestamp"),
    ),
    "value lengths": (lambda f: f.groupBy("topic").agg({"value": "max"}), ("value", "topic")),
    "header keys": (
        lambda f: f.selectExpr("topic", "explode_outer(headers) AS h").groupBy("topic", "h.key").count(),
        ("topic", "headers"),
    ),
    "distinct messages": (lambda f: f.distinct().groupBy("topic").count(), None),
    "select star": (lambda f: f.select("*").groupBy("topic").count(), ("topic",)),
    "a query built from frame.columns": (
        lambda f: f.groupBy("topic").count().selectExpr("topic", f"{len(f.columns)} AS n"),
        None,
    ),
    "does not analyse": (lambda f: f.groupBy("no_such_column").count(), None),
}


@pytest.mark.spark
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_the_columns_spark_keeps_for_an_aggregate_are_the_ones_inferred(any_spark: Any, name: str) -> None:
    aggregate, want = AGGREGATES[name]
    inferred = infer_read_columns(any_spark, aggregate)
    assert inferred.columns == want, inferred.reason
    assert inferred.reason


@pytest.mark.spark
def test_a_job_without_read_columns_reads_only_the_inferred_ones_and_stores_exact_sums(
    counting: Counting,
) -> None:
    topic, messages = keyed_topic(counting, 11, 700)

    def value_bytes_per_key(frame: Any) -> Any:
        return (
            frame.selectExpr("topic", "key", "length(value) AS n")
            .groupBy("topic", "key")
            .agg({"n": "sum"})
            .withColumnRenamed("sum(n)", "metric")
        )

    aggregate, seen = columns_seen(value_bytes_per_key)
    s = counting.settings("inferred", topic)
    with TransactionalJob(counting.spark, s, dataframe_aggregate=aggregate) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
        assert job.read_columns == ("key", "value", "topic")
    # The probe's frame had every column; the batch's only the inferred ones.
    assert seen[0] == list(KAFKA_SOURCE_COLUMNS) and seen[-1] == ["key", "value", "topic"]
    want: Counter[tuple[str, str | None, None]] = Counter()
    for _, key, value, _ in messages:
        want[("key", decode_key(key), None)] += len(value or b"")
    assert_stored(counting, "inferred", topic, {k: Decimal(v) for k, v in want.items()})


@pytest.mark.spark
def test_a_job_declaring_read_columns_is_not_inferred_for(
    spark: Any, kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    s = settings(kafka, database_url, "declared", topic)
    with TransactionalJob(
        spark, s, dataframe_aggregate=lambda f: f.groupBy("topic").count(), read_columns=KAFKA_SOURCE_COLUMNS
    ) as job:
        job.check_query()
        assert job.read_columns == KAFKA_SOURCE_COLUMNS


@pytest.mark.spark
def test_probing_a_query_that_does_not_analyse_prints_no_pyspark_json_dump(
    spark: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # PySpark logs each AnalysisException with a query context as a JSON line holding the JVM's
    # stack trace; the probes expect such errors and report them in one line of their own.
    from pyspark.logger import PySparkLogger

    from txstore.spark.source.probing import QueryRefused, analysed_fields
    from txstore.spark.source.pushdown import infer_pushdown

    def broken(frame: Any) -> Any:
        return frame.groupBy("no_such_column").count()

    logger = PySparkLogger.getLogger("DataFrameQueryContextLogger")
    was = logger.disabled
    logger.disabled = False  # on, so that the probes must silence it
    try:
        capfd.readouterr()
        assert infer_read_columns(spark, broken).columns is None
        assert infer_pushdown(spark, broken, None).partial is None
        with pytest.raises(QueryRefused):
            analysed_fields(spark, broken, ("topic",))
        err = capfd.readouterr().err
        assert "QueryContextLogger" not in err and "UNRESOLVED_COLUMN" not in err
        # Only while probing: PySpark's own logging is as it was afterwards.
        assert not logger.disabled
    finally:
        logger.disabled = was


def test_probes_in_two_threads_leave_pysparks_logging_as_it_was() -> None:
    # Jobs in threads of one process (a test runs two results-table jobs so) probe at once: the
    # first out must not turn the loggers back on under the other, nor the last leave them off.
    import threading

    from pyspark.logger import PySparkLogger

    from txstore.spark.source.probing import quiet_analysis_errors

    logger = PySparkLogger.getLogger("DataFrameQueryContextLogger")
    was = logger.disabled
    logger.disabled = False
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with quiet_analysis_errors():
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    def second() -> None:
        assert first_in.wait(10)
        with quiet_analysis_errors():
            second_in.set()
            assert first_out.wait(10)
            seen.append(logger.disabled)  # still probing: still silenced

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen == [True]
        assert not logger.disabled
    finally:
        logger.disabled = was


@pytest.mark.spark
@pytest.mark.parametrize("flavour", ["classic", pytest.param("connect", marks=pytest.mark.connect)])
def test_two_jobs_probing_at_once_each_get_their_own_plan_and_stdout_is_left_alone(
    request: pytest.FixtureRequest, flavour: str
) -> None:
    # Jobs in threads of one process probe their queries at once. Plan text captured by swapping
    # sys.stdout (process-wide) lands in whichever buffer is current: a filtered job could be
    # matched on another job's unfiltered plan and pushed down without its filter.
    import sys
    import threading

    from txstore.spark.source.used_columns import explained_plan

    spark = request.getfixturevalue("spark" if flavour == "classic" else "spark_connect")
    queries: dict[str, Callable[[Any], Any]] = {
        "filtered": lambda f: f.where("partition = 7").groupBy("topic").count(),
        "plain": lambda f: f.groupBy("key").count(),
    }
    stdout = sys.stdout
    wrong: list[str] = []
    start = threading.Barrier(len(queries), timeout=30)

    def probe(name: str) -> None:
        start.wait()
        for _ in range(25):
            plan = explained_plan(spark, queries[name])
            has_filter = "Filter" in plan and "partition#" in plan and "= 7" in plan
            if (name == "filtered") != has_filter or plan.count("== Optimized Logical Plan ==") != 1:
                wrong.append(f"{name}: {plan[:300]!r}")

    threads = [threading.Thread(target=probe, args=(name,)) for name in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert sys.stdout is stdout
    assert wrong == []

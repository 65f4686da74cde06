"""readStream.format("txstore") into sinks that are not txstore's: Spark's file sink, foreachBatch.

Nothing but the txstore sink moves ``txn_offsets`` with results; with another sink the source
moves them when Spark commits a micro-batch (checkpoint-led: the sink's own guarantee holds,
Spark's file sink exactly once through its log), so restarts do not stop on a mismatch and
``txstore status`` follows the query. Real Spark, real PostgreSQL, the mock broker.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.counting import Counting
from tests.helpers.streams import JOB, stream
from txstore.testing.mock_kafka import MockKafkaCluster


def _parquet_rows(spark: Any, path: Path) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in spark.read.parquet(str(path)).collect())


def _expected(counts: dict[int, int]) -> list[tuple[int, int]]:
    return sorted((p, o) for p, n in counts.items() for o in range(n))


def into_parquet(df: Any, out: Path, checkpoint: Path) -> None:
    """One Trigger.AvailableNow run of ``df`` into Spark's file sink (parquet files in ``out``),
    which must end without an error."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_the_source_into_spark_file_sink_writes_each_message_once_over_restarts_and_moves_txn_offsets(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(2)
    out, checkpoint = tmp_path / "out", tmp_path / "chk"

    def run(**options: str) -> None:
        into_parquet(streaming.stream(topic, **options).select("partition", "offset"), out, checkpoint)

    produced = {0: 6, 1: 3}
    streaming.produce(topic, produced)
    run(maxOffsetsPerTrigger="4")  # several micro-batches in one run
    assert _parquet_rows(streaming.spark, out) == _expected(produced)
    moved = streaming.offsets(topic, job=JOB)
    assert all(moved[p] <= streaming.log_ends(topic)[p] for p in moved)

    for more in ({0: 2, 1: 5}, {}, {1: 1}):  # restarts: new messages, none, a few
        streaming.produce(topic, more)
        for p, n in more.items():
            produced[p] += n
        run()
        assert _parquet_rows(streaming.spark, out) == _expected(produced)
    # Spark commits a micro-batch to its source when it starts the next: by now every one but
    # the last is in txn_offsets, and none is ever ahead of what the file sink holds.
    final = streaming.offsets(topic, job=JOB)
    assert all(final[p] <= produced[p] for p in produced)
    assert sum(final.values()) >= sum(produced.values()) - 1 - 5
    assert streaming.totals(topic, job=JOB) == {topic: 0}  # the file sink's data is not txstore's counts


def test_foreach_batch_restarts_without_a_checkpoint_mismatch_and_txn_offsets_follow(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(1)
    checkpoint = tmp_path / "chk"
    seen: list[int] = []

    def collect(frame: Any, batch_id: int) -> None:
        seen.extend(r["offset"] for r in frame.select("offset").collect())

    def run() -> None:
        query = (
            streaming.stream(topic, maxOffsetsPerTrigger="3")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    streaming.produce(topic, {0: 7})
    run()
    streaming.produce(topic, {0: 4})
    run()
    run()
    assert sorted(seen) == list(range(11))
    stored = streaming.offsets(topic, job=JOB)[0]
    assert 8 <= stored <= 11


def test_include_headers_adds_the_headers_column_to_batch_reads_and_streams_as_spark_does(
    any_spark: Any,
    kafka: MockKafkaCluster,
    database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """On classic Spark and through a Spark Connect client (the source on its server)."""
    import txstore
    from tests.spark.source.test_datasource import Outgoing, read, send

    spark = any_spark
    txstore.register(spark)
    topic = new_topic(1)
    sent: list[Outgoing] = [(0, b"a", b"1", 1_767_225_600_000, [("trace", b"t1")]), (0, b"b", b"2", 1, None)]
    send(kafka.bootstrap_servers, topic, sent)
    spark_columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]

    def headers(rows: Any) -> list[Any]:
        return [None if r.headers is None else [(h.key, h.value) for h in r.headers] for r in rows]

    assert read(spark, topic, kafka).columns == spark_columns
    assert read(spark, topic, kafka, includeHeaders="false").columns == spark_columns
    with_headers = read(spark, topic, kafka, includeHeaders="true")
    assert with_headers.columns == [*spark_columns, "headers"]
    assert headers(with_headers.orderBy("offset").collect()) == [[("trace", b"t1")], None]

    assert stream(spark, kafka, database_url, topic).columns == spark_columns
    out, checkpoint = tmp_path / "out", tmp_path / "chk"
    streamed = stream(spark, kafka, database_url, topic, includeHeaders="true")
    assert streamed.columns == [*spark_columns, "headers"]
    into_parquet(streamed.select("offset", "headers"), out, checkpoint)
    assert headers(spark.read.parquet(str(out)).orderBy("offset").collect()) == [[("trace", b"t1")], None]

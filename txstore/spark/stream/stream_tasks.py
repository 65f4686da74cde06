"""The reading tasks of ``readStream.format("txstore")``: a micro-batch's ranges read, and receipted.

Spark runs :meth:`ReadingTasks.read` in its executors' Python workers on the pickled source (the
planner's connections are left out of the pickle). A task reads its ranges in their planned order
(a retried task gets the same pickled partition, so it reads the same messages), through the batch
source's Arrow reader, or with ``txstore.countMessages`` counts each range whole and yields one row
per range; once its last range was read to its end, it records its receipt in
``txn_stream_reads`` (:func:`~txstore.postgres.stream_plans.record_read`), which the sink checks
before it commits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from pyspark.sql.datasource import InputPartition

from txstore.core.failpoints import FailPoints
from txstore.core.micro_batch import RangeRead, Receipt
from txstore.core.ranges import OffsetRange
from txstore.kafka.reader import RangeReader
from txstore.kafka.together import read_together, together_candidates
from txstore.postgres.kept import kept_connection
from txstore.postgres.reconnect import connect_retrying
from txstore.postgres.stream_plans import record_read, stream_privileges
from txstore.spark.ranges.range_task import task_attempt, task_run
from txstore.spark.runtime.worker_heap import freeze_once
from txstore.spark.source.datasource import TxstoreReader, partition_ranges
from txstore.spark.stream.stream_advice import restated_rows
from txstore.spark.stream.stream_offsets import StreamPartition
from txstore.spark.stream.stream_options import GIVEN_BY, StreamOptions


def _reconnect(url: str) -> psycopg.Connection:
    """A reading task's connection for its receipt: a server restarting is waited for, within
    :mod:`~txstore.postgres.reconnect`'s bounds."""
    return connect_retrying(url, given_by=GIVEN_BY)


class ReadingTasks:
    """The stream source's reading side (a mixin of :class:`~txstore.spark.stream.stream_source.TxstoreStreamReader`)."""

    options: StreamOptions
    batch_reader: TxstoreReader | None  # None: txstore.countMessages, one row per range

    def read(self, partition: InputPartition) -> Iterator[Any]:
        freeze_once()  # PySpark's collection after each task then skips the imports' objects
        ranges = partition_ranges(partition)
        if self.batch_reader is None:
            return restated_rows(self._count(partition, ranges), self.options.job)
        return restated_rows(self._messages(self.batch_reader, partition, ranges), self.options.job)

    def _after_first_range(self) -> None:
        if self.options.failpoints:  # tests only
            FailPoints.parse(self.options.failpoints).hit("after-first-range", task_attempt())

    def _record(self, partition: InputPartition, reads: Sequence[RangeRead]) -> None:
        """The task's receipt (:mod:`txstore.core.micro_batch`): its ranges were read to their end,
        in this query's micro-batch, as this Spark stage and partition."""
        if not isinstance(partition, StreamPartition):
            return
        run = task_run()
        receipt = Receipt(
            partition.index, run.stage, run.partition, run.query_id, run.batch_id, tuple(reads), run.run_id
        )
        job = self.options.job
        with (
            stream_privileges(job, "recording a reading task's receipt"),
            kept_connection(self.options.database_url, _reconnect) as conn,
        ):
            record_read(conn, job, partition.plan_id, receipt)

    def _messages(
        self, reader: TxstoreReader, partition: InputPartition, ranges: Sequence[OffsetRange]
    ) -> Iterator[Any]:
        """The messages of the task's ranges, one range after the other (the batch source's reader);
        the receipt once the last range was read to its end."""
        reads = []
        for i, r in enumerate(ranges):
            kafka = RangeReader(self.options.read.kafka_conf, r, pause_gc=False, job=self.options.job)
            yield from reader.read_range(kafka)
            reads.append(RangeRead(r, kafka.messages, kafka.last))
            if i == 0:
                self._after_first_range()
        self._record(partition, reads)

    def _count(self, partition: InputPartition, ranges: Sequence[OffsetRange]) -> Iterator[Any]:
        """``txstore.countMessages``: each range read whole and its messages counted; one row per
        range (:data:`~txstore.spark.stream.stream_options.COUNT_SCHEMA`), all in one record batch.

        As the per-range count path: no row per message is built or handed to Spark (the
        reader's checks of the planned log are the same); a retried task reads its ranges again
        and counts the same messages.
        """
        import pyarrow as pa

        if not ranges:
            return
        reads = []
        conf, job = self.options.read.kafka_conf, self.options.job
        # Small ranges are counted on one consumer at once (txstore.kafka.together), the others alone.
        together = read_together(conf, together_candidates(ranges), job, keep=False)
        for i, r in enumerate(ranges):
            kafka = together.get(r.key) or RangeReader(conf, r, job=job)  # gc paused throughout
            for _ in kafka:
                pass
            reads.append(RangeRead(r, kafka.messages, kafka.last))
            if i == 0:
                self._after_first_range()
        self._record(partition, reads)
        yield pa.RecordBatch.from_pydict(
            {
                "topic": [r.topic for r in ranges],
                "partition": [r.partition for r in ranges],
                "txstore_from": [r.from_offset for r in ranges],
                "txstore_until": [r.until_offset for r in ranges],
                "txstore_messages": [read.messages for read in reads],
            },
            schema=pa.schema(
                [
                    pa.field("topic", pa.string()),
                    pa.field("partition", pa.int32()),
                    pa.field("txstore_from", pa.int64()),
                    pa.field("txstore_until", pa.int64()),
                    pa.field("txstore_messages", pa.int64()),
                ]
            ),
        )

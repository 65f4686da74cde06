"""format("txstore") read throughput: Arrow record batches versus Python tuples.

``python -m bench.datasource_read [--messages 500000] [--partitions 10] [--rounds 3]``

Produces the messages to the test broker (in its own process), then measures,
alternating in each round so both see the same machine load:

1. in this process, the reader's work per message: a range read with
   :class:`~txstore.kafka.reader.RangeReader` and converted to what a Python data
   source hands Spark: Arrow batches (:func:`txstore.spark.source.arrow.messages_to_record_batch`)
   or tuples (as ``read_ranges`` built them before it yielded Arrow batches) that PySpark's
   worker then turns into Arrow itself (``records_to_arrow_batches``);
2. through Spark (classic ``local[2]``): ``spark.read.format(...).load().count()``
   with the txstore reader and with the same reader yielding tuples.

Prints rows/s for each (best and median over the rounds). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.broker import BrokerProcess
from bench.common import local_session
from bench.workload import Workload, produce
from txstore.core.ranges import OffsetRange
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.spark.source.arrow import messages_to_record_batch
from txstore.spark.source.datasource import RangePartition, TxstoreReader
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.source_columns import kafka_source_schema
from txstore.spark.source_format import TxstoreDataSource


@dataclass(frozen=True)
class _RangeRows:
    """A range's messages as one Python tuple each (Kafka-source columns): the comparison."""

    kafka_conf: Mapping[str, Any]

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[tuple[Any, ...]]:
        utc = timezone.utc
        for offset_range in ranges:
            for batch in RangeReader(self.kafka_conf, offset_range, pause_gc=False):
                for m in batch:
                    ts_type, ts = m.timestamp()
                    headers = m.headers()
                    yield (
                        m.key(),
                        m.value(),
                        m.topic(),
                        m.partition(),
                        m.offset(),
                        datetime.fromtimestamp(ts / 1000, utc) if ts_type else None,
                        ts_type - 1,
                        [(k, v) for k, v in headers] if headers else None,  # type: ignore[str-unpack]
                    )


class TupleReader(TxstoreReader):
    """The txstore reader, but yielding one Python tuple per message (the comparison)."""

    def read(self, partition: Any) -> Iterator[Any]:
        if isinstance(partition, RangePartition):
            yield from _RangeRows(self.options.kafka_conf)([partition.range])


class TupleDataSource(TxstoreDataSource):
    @classmethod
    def name(cls) -> str:
        return "txstore_tuples"

    def reader(self, schema: Any) -> TupleReader:
        return TupleReader(parse_read_options(self.options, os.environ), schema)


def _in_process(conf: dict[str, Any], ranges: list[OffsetRange], arrow: bool) -> int:
    rows = 0
    if arrow:
        for r in ranges:
            for batch in RangeReader(conf, r, pause_gc=False):
                rows += messages_to_record_batch(batch).num_rows
        return rows
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    for r in ranges:
        tuples = _RangeRows(conf)([r])
        for converted in records_to_arrow_batches(tuples, 10_000, kafka_source_schema(), TupleDataSource({})):
            rows += converted.num_rows
    return rows


def _timed(run: Callable[[], int], expected: int) -> float:
    started = time.perf_counter()
    rows = run()
    elapsed = time.perf_counter() - started
    if rows != expected:
        raise RuntimeError(f"read {rows} rows, expected {expected}")
    return rows / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.datasource_read", description=__doc__)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--value-bytes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    root = Path(__file__).resolve().parent.parent
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    per_partition = args.messages // args.partitions
    total = per_partition * args.partitions
    workload = Workload("datasource-read", total, args.partitions, args.value_bytes)
    with BrokerProcess() as broker:
        broker.create_topic(workload.topic, workload.partitions)
        produce(broker.bootstrap_servers, workload)
        conf = client_config(broker.bootstrap_servers)
        ranges = [OffsetRange(workload.topic, p, 0, per_partition) for p in range(args.partitions)]

        spark = local_session("local[2]", "txstore bench datasource_read")
        spark.dataSource.register(TxstoreDataSource)
        spark.dataSource.register(TupleDataSource)

        def through_spark(name: str) -> Callable[[], int]:
            def run() -> int:
                frame = (
                    spark.read.format(name)
                    .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                    .option("subscribe", workload.topic)
                    .load()
                )
                return int(frame.count())

            return run

        measured: dict[str, list[float]] = {}
        runs: dict[str, Callable[[], int]] = {
            "in-process, Arrow batches": lambda: _in_process(conf, ranges, arrow=True),
            "in-process, tuples + PySpark's conversion": lambda: _in_process(conf, ranges, arrow=False),
            "Spark count(), Arrow batches": through_spark("txstore"),
            "Spark count(), tuples": through_spark("txstore_tuples"),
        }
        for run in runs.values():  # warm up: Python workers, pooled consumers
            _timed(run, total)
        for _ in range(args.rounds):
            for name, run in runs.items():
                measured.setdefault(name, []).append(_timed(run, total))
        spark.stop()
    print(f"{total:,} messages, {args.partitions} partitions, {args.value_bytes}-byte values")
    for name, rates in measured.items():
        print(
            f"{name:45s} best {max(rates):>12,.0f} rows/s   median {statistics.median(rates):>12,.0f} rows/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kafka messages as Arrow record batches with the columns of Spark's Kafka source.

One function, :func:`messages_to_record_batch`, turns a batch of consumed
messages (a :class:`~txstore.reader.RangeReader` batch, or any list of
``confluent_kafka.Message``) into a ``pyarrow.RecordBatch`` whose schema is
exactly :data:`KAFKA_ARROW_SCHEMA`: what PySpark derives from
:func:`txstore.spark.kafka_source_schema` with the session time zone UTC, so
Spark takes the batch as it is (a Python data source's ``read``, or
``mapInArrow``) without converting a row.

Cost per message: one ``map()`` per field over the batch (``key``,
``value``, ``offset``, ``timestamp``, ``headers``, ``topic``, ``partition``),
which calls the C methods without Python bytecode per message, and no tuple
or dict per row. Everything else is done by Arrow over whole columns: the
``(type, milliseconds)`` pairs become a struct array, then microseconds with
nulls and Kafka's timestamp type; headers go in as librdkafka gives them; the
topic and partition of a one-partition batch are repeated, not converted.

Mapping, as in Spark's Kafka source: ``timestamp`` is the message timestamp
(milliseconds since the epoch, UTC) as ``timestamp[us, UTC]``, null when the
message has none; ``timestampType`` is Kafka's (-1 none, 0 create time,
1 log-append time), i.e. librdkafka's type minus one; ``headers`` is null
when a message has no headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

KAFKA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field(
            "headers",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct(
                        [
                            pa.field("key", pa.string(), nullable=False),
                            pa.field("value", pa.binary(), nullable=True),
                        ]
                    ),
                    nullable=True,
                )
            ),
            nullable=True,
        ),
    ]
)
"""Spark's Kafka-source columns in Arrow: ``to_arrow_schema(kafka_source_schema(), timezone="UTC")``."""

_HEADERS_TYPE = KAFKA_ARROW_SCHEMA.field("headers").type
_TIMESTAMP_TYPE = KAFKA_ARROW_SCHEMA.field("timestamp").type
_STAMP_TYPE = pa.struct([pa.field("type", pa.int32(), False), pa.field("ms", pa.int64(), False)])
_NO_TIMESTAMP = 0  # librdkafka's TIMESTAMP_NOT_AVAILABLE

# Unbound methods: map() calls them without looking up an attribute per message.
_key = Message.key
_value = Message.value
_offset = Message.offset
_timestamp = Message.timestamp
_headers = Message.headers
_topic = Message.topic
_partition = Message.partition


def empty_record_batch() -> pa.RecordBatch:
    """No rows, the Kafka-source schema."""
    return pa.RecordBatch.from_pylist([], schema=KAFKA_ARROW_SCHEMA)


def _same(values: Sequence[Any]) -> bool:
    first = values[0]
    return values.count(first) == len(values)


def messages_to_record_batch(messages: Sequence[Any]) -> pa.RecordBatch:
    """The messages (``confluent_kafka.Message``, none an error event) as one record batch.

    Steps: one pass over the messages collects each column's Python values;
    then each column becomes an Arrow array of its exact type. Topic and
    partition are usually the same for the whole batch (a range reader's
    batch is one partition): they are then repeated by Arrow, not built
    per message. Timestamps become microseconds, null where librdkafka has
    no timestamp; timestamp types are shifted to Kafka's numbering.
    """
    n = len(messages)
    if n == 0:
        return empty_record_batch()
    keys = list(map(_key, messages))
    values = list(map(_value, messages))
    offsets = list(map(_offset, messages))
    stamps = list(map(_timestamp, messages))
    headers = list(map(_headers, messages))
    topics = list(map(_topic, messages))
    partitions = list(map(_partition, messages))

    topic_array = (
        pa.repeat(pa.scalar(topics[0], pa.string()), n) if _same(topics) else pa.array(topics, pa.string())
    )
    partition_array = (
        pa.repeat(pa.scalar(partitions[0], pa.int32()), n)
        if _same(partitions)
        else pa.array(partitions, pa.int32())
    )
    # (type, milliseconds) tuples straight into a struct array: no Python per message.
    kinds, millis = pa.array(stamps, _STAMP_TYPE).flatten()
    micros = pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(_TIMESTAMP_TYPE)
    missing = pc.equal(kinds, _NO_TIMESTAMP)
    if pc.any(missing).as_py():
        micros = pc.if_else(missing, pa.scalar(None, _TIMESTAMP_TYPE), micros)
    kafka_kinds = pc.subtract(kinds, pa.scalar(1, pa.int32()))
    # librdkafka gives headers as [(str, bytes | None), ...] or None: Arrow takes them as they are.
    header_array = (
        pa.nulls(n, _HEADERS_TYPE) if headers.count(None) == n else pa.array(headers, _HEADERS_TYPE)
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            topic_array,
            partition_array,
            pa.array(offsets, pa.int64()),
            micros,
            kafka_kinds,
            header_array,
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )


def record_batches(batches: Iterable[Sequence[Any]]) -> Iterator[pa.RecordBatch]:
    """Each batch of messages (a :class:`~txstore.reader.RangeReader` made with ``pause_gc=False``)
    as a record batch, with Python's cyclic garbage collector paused while a batch is fetched
    and converted, and on again at each ``yield``.

    Ten thousand fresh ``Message`` objects per batch make the collector walk them over and
    over: reading and converting ran at 245,000 messages/s with it on, 725,000 with it
    paused (one process, 500,000 messages, loaded machine). Pausing it for the whole read, as
    a task's aggregate does, is not safe here: Spark may stop pulling batches for good (a
    ``limit``), and the collector would stay off. Paused per batch, it is back on whenever
    this generator is suspended, and the batch's messages are freed by then.
    """
    from txstore.reader import gc_paused

    messages = iter(batches)
    while True:
        with gc_paused():
            batch = next(messages, None)
            if batch is None:
                return
            record_batch = messages_to_record_batch(batch)
            del batch
        yield record_batch

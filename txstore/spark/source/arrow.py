"""Kafka messages as Arrow record batches with the columns of Spark's Kafka source.

One function, :func:`messages_to_record_batch`, turns a batch of consumed
messages (a :class:`~txstore.kafka.reader.RangeReader` batch, or any list of
``confluent_kafka.Message``) into a ``pyarrow.RecordBatch`` whose schema is
exactly :data:`KAFKA_ARROW_SCHEMA`, or the columns of it a reader asks for
(:func:`arrow_schema`): what PySpark derives from
:func:`txstore.spark.source.source_columns.kafka_source_schema` with the session time zone UTC, so
Spark takes the batch as it is (a Python data source's ``read``, or
``mapInArrow``) without converting a row.

Cost per message: one ``map()`` per field asked for over the batch (``key``,
``value``, ``offset``, ``timestamp``, ``headers``, ``topic``, ``partition``),
which calls the C methods without Python bytecode per message, and no tuple
or dict per row. Everything else is done by Arrow over whole columns: the
``(type, milliseconds)`` pairs become a struct array, then microseconds with
nulls and Kafka's timestamp type; headers go in as librdkafka gives them; the
topic and partition of a one-partition batch are repeated, not converted (a
range reader's batch: taken from its range, no message asked), and a range
reader's consecutive offsets are a range.

Mapping, as in Spark's Kafka source: ``timestamp`` is the message timestamp
(milliseconds since the epoch, UTC) as ``timestamp[us, UTC]``, null when the
message has none; ``timestampType`` is Kafka's (-1 none, 0 create time,
1 log-append time), i.e. librdkafka's type minus one; ``headers`` is null
when a message has no headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, check_columns
from txstore.spark.source.source_columns import ColumnsInvalid as ColumnsInvalid  # re-exported

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


def arrow_schema(columns: Sequence[str] = KAFKA_SOURCE_COLUMNS) -> pa.Schema:
    """The Arrow schema of the Kafka-source ``columns``, in the order given."""
    return pa.schema([KAFKA_ARROW_SCHEMA.field(c) for c in check_columns(columns, "columns")])


def empty_record_batch(schema: pa.Schema = KAFKA_ARROW_SCHEMA) -> pa.RecordBatch:
    """No rows, the Kafka-source schema (or the part of it that ``schema`` names)."""
    return pa.RecordBatch.from_pylist([], schema=schema)


def _same(values: Sequence[Any]) -> bool:
    first = values[0]
    return values.count(first) == len(values)


def _repeated_or_array(
    messages: Sequence[Any], field: Any, arrow_type: pa.DataType, known: Any | None
) -> pa.Array:
    """Topic and partition: ``known`` (the range's, every message's) or one value for the whole
    batch, repeated by Arrow; else each message's ``field``."""
    if known is not None:
        return pa.repeat(pa.scalar(known, arrow_type), len(messages))
    values = list(map(field, messages))
    if _same(values):
        return pa.repeat(pa.scalar(values[0], arrow_type), len(values))
    return pa.array(values, arrow_type)


def _offsets(messages: Sequence[Any], one_partition: bool) -> pa.Array:
    """The offsets. One partition's batch (strictly increasing offsets) whose first and last
    are ``len - 1`` apart holds every offset between: that is a range, built without a Python
    int per message (120 -> 10 ns a message). Holes (transaction markers, compaction) or
    messages of several partitions: each message's offset."""
    first: int = messages[0].offset()
    count = len(messages)
    if one_partition and messages[-1].offset() - first + 1 == count:
        return pa.array(np.arange(first, first + count, dtype=np.int64))
    return pa.array(list(map(_offset, messages)), pa.int64())


def _timestamps(messages: Sequence[Any]) -> tuple[pa.Array, pa.Array]:
    """``timestamp`` (microseconds, null where librdkafka has none) and ``timestampType``
    (Kafka's numbering), from one pass over the messages."""
    # (type, milliseconds) tuples straight into a struct array: no Python per message.
    kinds, millis = pa.array(list(map(_timestamp, messages)), _STAMP_TYPE).flatten()
    micros = pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(_TIMESTAMP_TYPE)
    missing = pc.equal(kinds, _NO_TIMESTAMP)
    if pc.any(missing).as_py():
        micros = pc.if_else(missing, pa.scalar(None, _TIMESTAMP_TYPE), micros)
    return micros, pc.subtract(kinds, pa.scalar(1, pa.int32()))


def _headers_array(messages: Sequence[Any]) -> pa.Array:
    headers = list(map(_headers, messages))
    if headers.count(None) == len(headers):
        return pa.nulls(len(headers), _HEADERS_TYPE)
    # librdkafka gives headers as [(str, bytes | None), ...] or None: Arrow takes them as they are.
    return pa.array(headers, _HEADERS_TYPE)


def messages_to_record_batch(
    messages: Sequence[Any], schema: pa.Schema = KAFKA_ARROW_SCHEMA, source: tuple[str, int] | None = None
) -> pa.RecordBatch:
    """The messages (``confluent_kafka.Message``, none an error event) as one record batch.

    ``schema``: :data:`KAFKA_ARROW_SCHEMA`, or the part of it that a reader
    needs (:func:`arrow_schema`); only those columns are built, so a
    query over ``topic`` alone never touches a key, value or header.

    ``source``: the (topic, partition) every message is known to come from
    (a :class:`~txstore.kafka.reader.RangeReader`'s batch: its consumer is
    assigned that one partition); its topic and partition columns are then
    repeated without asking a single message: a ``topic`` column took 227 ns
    a message built from the messages (a Python string each, then compared),
    13 ns given its source (one process, 500,000 messages, 15 rounds); and
    consecutive offsets become a range (:func:`_offsets`).

    Steps: each column needed is one ``map()`` over the messages, then an
    Arrow array of its exact type. Topic and partition are usually the same
    for the whole batch (a range reader's batch is one partition): they are
    then repeated by Arrow, not built per message. Timestamps become
    microseconds, null where librdkafka has no timestamp; timestamp types
    are shifted to Kafka's numbering.
    """
    if not messages:
        return empty_record_batch(schema)
    names = schema.names
    stamps = _timestamps(messages) if "timestamp" in names or "timestampType" in names else None
    arrays = []
    for name in names:
        if name == "key":
            arrays.append(pa.array(list(map(_key, messages)), pa.binary()))
        elif name == "value":
            arrays.append(pa.array(list(map(_value, messages)), pa.binary()))
        elif name == "topic":
            arrays.append(
                _repeated_or_array(messages, _topic, pa.string(), None if source is None else source[0])
            )
        elif name == "partition":
            arrays.append(
                _repeated_or_array(messages, _partition, pa.int32(), None if source is None else source[1])
            )
        elif name == "offset":
            arrays.append(_offsets(messages, source is not None))
        elif name == "timestamp":
            assert stamps is not None
            arrays.append(stamps[0])
        elif name == "timestampType":
            assert stamps is not None
            arrays.append(stamps[1])
        else:
            arrays.append(_headers_array(messages))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def record_batches(
    batches: Iterable[Sequence[Any]],
    schema: pa.Schema = KAFKA_ARROW_SCHEMA,
    source: tuple[str, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Each batch of messages (a :class:`~txstore.kafka.reader.RangeReader` made with ``pause_gc=False``)
    as a record batch of ``schema``'s columns, with Python's cyclic garbage collector paused while a batch is fetched
    and converted, and on again at each ``yield``. ``source``: the (topic, partition) of a
    range reader's batches, as for :func:`messages_to_record_batch`.

    Ten thousand fresh ``Message`` objects per batch make the collector walk them over and
    over: reading and converting ran at 245,000 messages/s with it on, 725,000 with it
    paused (one process, 500,000 messages, loaded machine). Pausing it for the whole read, as
    a task's aggregate does, is not safe here: Spark may stop pulling batches for good (a
    ``limit``), and the collector would stay off. Paused per batch, it is back on whenever
    this generator is suspended, and the batch's messages are freed by then.
    """
    from txstore.kafka.reader import gc_paused

    messages = iter(batches)
    while True:
        with gc_paused():
            batch = next(messages, None)
            if batch is None:
                return
            record_batch = messages_to_record_batch(batch, schema, source)
            del batch
        yield record_batch


OUTPUT_ROWS = 100_000
"""Rows per record batch handed to Spark (:func:`coalesce`)."""

OUTPUT_BYTES = 16 * 1024 * 1024
"""Bytes per record batch handed to Spark, at most about (big values: fewer rows)."""


def coalesce(
    batches: Iterable[pa.RecordBatch], rows: int = OUTPUT_ROWS, max_bytes: int = OUTPUT_BYTES
) -> Iterator[pa.RecordBatch]:
    """The record batches (one schema) joined into batches of about ``rows`` rows or
    ``max_bytes`` bytes, whichever comes first, in order (a batch already that big passes as it is).

    Spark pays a cost per Arrow batch it takes from a Python worker (a
    message on the socket, a columnar batch to wrap and turn into rows):
    2M one-column rows cost 660 ms of Spark's time in 10,000-row batches,
    300 ms in 100,000-row ones (measured, 2 cores). The reader fetches
    10,000 messages at a time; joining their columns after conversion
    copies Arrow buffers only, and holds no ``Message`` objects.
    """
    held: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count >= rows or size >= max_bytes:
            yield _joined(held)
            held, count, size = [], 0, 0
    if held:
        yield _joined(held)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    columns = [pa.concat_arrays([b.column(i) for b in batches]) for i in range(first.num_columns)]
    return pa.RecordBatch.from_arrays(columns, schema=first.schema)

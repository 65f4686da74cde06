"""format("txstore") without servers: options, offset planning, and messages as Arrow batches."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from confluent_kafka import Message

from txstore.core.errors import ConfigError, DataLoss, OffsetOutOfLog
from txstore.core.ranges import OffsetRange, PartitionWatermarks
from txstore.core.starting import EARLIEST, LATEST, StartingOffsets, parse_starting_offsets
from txstore.spark.source.arrow import (
    KAFKA_ARROW_SCHEMA,
    ColumnsInvalid,
    arrow_schema,
    check_columns,
    coalesce,
    messages_to_record_batch,
)
from txstore.spark.source.datasource import schema_columns
from txstore.spark.source.read_options import (
    NOT_TAKEN,
    READER_FIXED_SETTINGS,
    SPARK_OPTION_NAMES,
    ReadOptions,
    parse_read_options,
)
from txstore.spark.source.read_planning import plan_job_ranges, plan_read_ranges
from txstore.spark.source.source_columns import kafka_source_schema

BASE = {"kafka.bootstrap.servers": "k:9092", "subscribe": "a,b"}


def options(**given: str) -> ReadOptions:
    return parse_read_options({**BASE, **given}, environ={})


def refusal(given: dict[str, str], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_read_options(given, environ or {})
    text = str(caught.value)
    assert "\n" not in text
    return text


def marks(topic: str, partition: int, low: int, high: int) -> PartitionWatermarks:
    return PartitionWatermarks(topic, partition, low, high)


# -- options -------------------------------------------------------------------------------


def test_options_in_any_case_are_parsed_and_kafka_settings_lose_their_prefix() -> None:
    parsed = parse_read_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "k1:9092,k2:9092",
            "Subscribe": " a , b ",
            "startingOffsets": '{"a": {"0": 23, "1": -2}}',
            "ENDINGOFFSETS": '{"b": {"0": 50}}',
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.password": "s3cret",
            "minPartitions": "8",
            "failOnDataLoss": "true",
            "includeHeaders": "TRUE",
        },
        environ={},
    )
    assert parsed.topics == ("a", "b")
    assert parsed.bootstrap_servers == "k1:9092,k2:9092"
    assert parsed.kafka_options == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret"}
    assert parsed.kafka_conf["bootstrap.servers"] == "k1:9092,k2:9092"
    assert parsed.starting == StartingOffsets(EARLIEST, {("a", 0): 23, ("a", 1): EARLIEST})
    assert parsed.ending == StartingOffsets(LATEST, {("b", 0): 50})
    assert parsed.min_partitions == 8
    assert parsed.include_headers is True
    assert parsed.job is None
    assert "s3cret" not in repr(parsed)


@pytest.mark.parametrize("setting", READER_FIXED_SETTINGS)
def test_a_reader_fixed_kafka_setting_is_refused_with_one_line_naming_it(setting: str) -> None:
    text = refusal({**BASE, f"kafka.{setting}": "x"})
    assert text.startswith(f"option kafka.{setting} cannot be set: the txstore reader fixes it")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"subscribe": "a"}, "option kafka.bootstrap.servers is required"),
        ({"kafka.bootstrap.servers": "k:1"}, "option subscribe (or assign) is required"),
        ({**BASE, "subscribe": "a,,a"}, "option subscribe names a topic twice"),
        ({**BASE, "subscribe": "a,b c"}, "option subscribe: 'b c' is not a valid Kafka topic name"),
        (
            {**BASE, "startOffsets": "earliest"},
            "unknown option 'startOffsets' for format('txstore') (did you mean startingOffsets?)",
        ),
        (
            {**BASE, "subscribePattern": "a.*"},
            "give one of option subscribe and option subscribePattern, not both (as in Spark)",
        ),
        ({**BASE, "failOnDataLoss": "maybe"}, "option failOnDataLoss must be true (stop on offsets"),
        ({**BASE, "includeHeaders": "yes"}, "option includeHeaders must be true or false, got 'yes'"),
        ({**BASE, "startingOffsets": "{oops"}, "option startingOffsets is not valid JSON"),
        (
            {**BASE, "startingOffsets": '{"c": {"0": 1}}'},
            "option startingOffsets names topics that are not subscribed: 'c'",
        ),
        (
            {**BASE, "startingOffsets": '{"a": {"0": -3}}'},
            "option startingOffsets: topic 'a' partition 0: offset -3 must be",
        ),
        ({**BASE, "endingOffsets": "earliest"}, "option endingOffsets cannot be earliest"),
        (
            {**BASE, "endingOffsets": '{"a": {"0": -2}}'},
            "option endingOffsets: topic 'a' partition 0: -2 (earliest) is not an end",
        ),
        (
            {**BASE, "minPartitions": "0"},
            "option minPartitions must be a whole number of at least 1, got '0'",
        ),
        ({**BASE, "txstore.job": "j"}, "option txstore.job 'j' needs the job's database"),
        (
            {
                **BASE,
                "txstore.job": "j",
                "txstore.databaseUrl": "postgresql://h/d",
                "endingOffsets": "latest",
            },
            "option endingOffsets cannot be combined with txstore.job 'j'",
        ),
        ({**BASE, "txstore.job": "j", "txstore.databaseUrl": "mysql://u:pw@h/d"}, "is not a PostgreSQL URL"),
    ],
)
def test_a_bad_option_is_refused_with_one_line_naming_it(given: dict[str, str], expected: str) -> None:
    text = refusal(given)
    assert expected in text
    assert "pw" not in text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"subscribepattern": "a.*"}, "give one of option subscribe and option subscribePattern, not both"),
        ({"minpartitions": "0"}, "option minPartitions must be a whole number"),
        ({"failondataloss": "maybe"}, "option failOnDataLoss must be true (stop on offsets"),
        ({"startingoffsets": "{oops"}, "option startingOffsets is not valid JSON"),
        ({"endingoffsets": "earliest"}, "option endingOffsets cannot be earliest"),
        (
            {"startoffsets": "earliest"},
            "unknown option 'startoffsets' for format('txstore') (did you mean startingOffsets?)",
        ),
    ],
)
def test_an_option_spark_hands_over_lower_cased_is_named_as_documented(
    given: dict[str, str], expected: str
) -> None:
    # Spark lower-cases a Python data source's option names (CaseInsensitiveDict): the error
    # line names the option as Spark's and txstore's documentation spell it, as the user typed it.
    assert expected in refusal({"kafka.bootstrap.servers": "k:9092", "subscribe": "a,b", **given})


def test_an_option_whose_case_reaches_the_parser_is_named_as_typed() -> None:
    assert "option MINPARTITIONS must be" in refusal({**BASE, "MINPARTITIONS": "0"})
    bad_pattern = {"kafka.bootstrap.servers": "k:9092", "SubscribePattern": "a["}
    assert "option SubscribePattern 'a[' is not a valid regular expression" in refusal(bad_pattern)
    typed = options(STARTINGOFFSETS='{"a": {"7": 0}}')
    with pytest.raises(ConfigError, match=r"^option STARTINGOFFSETS names 'a' partition 7, which Kafka"):
        plan_read_ranges(typed, WATERMARKS)
    spark_given = parse_read_options({**BASE, "startingoffsets": '{"a": {"1": 3}}'}, {})
    with pytest.raises(DataLoss, match=r"^option startingOffsets: topic 'a' partition 1 offset 3"):
        plan_read_ranges(spark_given, WATERMARKS)


@pytest.mark.parametrize("given", [{"kafka.group.id": "spark-app"}, {"groupidprefix": "spark-kafka-source"}])
def test_a_kafka_consumer_group_is_refused_because_txstore_commits_no_offsets_to_one(
    given: dict[str, str],
) -> None:
    name = "kafka.group.id" if "kafka.group.id" in given else "groupIdPrefix"
    text = refusal({**BASE, **given})
    assert text.startswith(f"option {name} is refused: format('txstore') joins and commits to no ")
    assert "txn_offsets" in text and text.endswith("; drop the option")


@pytest.mark.parametrize(
    ("setting", "value", "instead"),
    [
        ("ssl.truststore.location", "/etc/kafka/trust.jks", "give option kafka.ssl.ca.location instead"),
        ("ssl.truststore.type", "JKS", "give option kafka.ssl.ca.location instead"),
        ("ssl.truststore.password", "s3cret", "give option kafka.ssl.ca.location instead"),
        (
            "ssl.keystore.location",
            "/etc/kafka/client.JKS",
            "give option kafka.ssl.certificate.location and option kafka.ssl.key.location instead",
        ),
        ("ssl.keystore.type", "JKS", "option kafka.ssl.certificate.location and option kafka.ssl.key"),
        ("sasl.jaas.config", "PlainLoginModule password='s3cret';", "option kafka.sasl.username and"),
    ],
)
def test_a_java_client_only_setting_is_refused_at_load_pointing_to_what_librdkafka_takes(
    setting: str, value: str, instead: str
) -> None:
    text = refusal({**BASE, f"kafka.{setting}": value, "kafka.ssl.key.password": "s3cret"})
    assert text.startswith(f"option kafka.{setting}")
    assert (
        "is a setting of Kafka's Java client that librdkafka, txstore's Kafka client, does not take" in text
    )
    assert instead in text
    assert "s3cret" not in text


def test_a_pkcs12_key_store_and_pem_files_are_librdkafka_settings_and_pass() -> None:
    pem = {
        "kafka.ssl.ca.location": "/etc/kafka/ca.pem",
        "kafka.ssl.certificate.location": "/etc/kafka/client.pem",
        "kafka.ssl.key.location": "/etc/kafka/client.key",
    }
    assert options(**pem).kafka_options["ssl.ca.location"] == "/etc/kafka/ca.pem"
    p12 = options(
        **{"kafka.ssl.keystore.location": "/etc/kafka/client.p12", "kafka.ssl.keystore.password": "x"}
    )
    assert p12.kafka_options["ssl.keystore.location"] == "/etc/kafka/client.p12"


def test_the_headers_column_is_there_only_with_include_headers_true_as_in_spark() -> None:
    assert options().columns == ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
    assert options(includeHeaders="false").columns == options().columns
    assert options(includeHeaders=" True ").columns == (*options().columns, "headers")
    assert kafka_source_schema(options().columns).names == list(options().columns)


@pytest.mark.parametrize("name", SPARK_OPTION_NAMES)
def test_every_option_of_spark_s_kafka_source_is_taken_or_refused_with_its_own_reason(name: str) -> None:
    values = {
        "subscribe": "a",
        "assign": '{"a": [0]}',
        "startingOffsets": "earliest",
        "startingOffsetsByTimestamp": '{"a": {"0": 1}}',
        "startingOffsetsByTimestampStrategy": "latest",
        "endingOffsets": "latest",
    }
    base = {
        k: v for k, v in BASE.items() if not (name in ("assign", "subscribePattern") and k == "subscribe")
    }
    given = {**base, name.lower(): values.get(name, "1"), "includeheaders": "true", "failondataloss": "true"}
    try:
        parse_read_options(given, {})
    except ConfigError as e:
        text = str(e)
        assert text.startswith(f"option {name} "), text  # as Spark's documentation spells it
        assert "unknown" not in text and "did you mean" not in text and "\n" not in text
        assert name.lower() in NOT_TAKEN or name in ("kafka.group.id", "groupIdPrefix"), text
    else:
        assert name.lower() not in NOT_TAKEN


def test_the_job_database_comes_from_the_option_or_else_from_txstore_database_url() -> None:
    from_env = parse_read_options({**BASE, "txstore.job": "j"}, {"TXSTORE_DATABASE_URL": "postgresql://e/d"})
    assert (from_env.job, from_env.database_url) == ("j", "postgresql://e/d")
    given = parse_read_options(
        {**BASE, "txstore.job": "j", "txstore.databaseUrl": "postgresql://o/d"},
        {"TXSTORE_DATABASE_URL": "postgresql://e/d"},
    )
    assert given.database_url == "postgresql://o/d"
    assert "postgresql" not in repr(given)


# -- planning from startingOffsets / endingOffsets ----------------------------------------

WATERMARKS = [marks("b", 0, 0, 7), marks("a", 1, 5, 20), marks("a", 0, 2, 10)]


def test_by_default_every_partition_is_read_from_its_log_start_to_its_log_end() -> None:
    assert plan_read_ranges(options(), WATERMARKS) == [
        OffsetRange("a", 0, 2, 10),
        OffsetRange("a", 1, 5, 20),
        OffsetRange("b", 0, 0, 7),
    ]


def test_latest_start_reads_nothing_and_json_names_single_partitions_others_keep_the_default() -> None:
    assert plan_read_ranges(options(startingOffsets="latest"), WATERMARKS) == []
    planned = options(
        startingOffsets='{"a": {"0": 4, "1": -1}}', endingOffsets='{"a": {"0": 6}, "b": {"0": -1}}'
    )
    assert plan_read_ranges(planned, WATERMARKS) == [OffsetRange("a", 0, 4, 6), OffsetRange("b", 0, 0, 7)]


def test_an_explicit_offset_outside_the_log_is_refused_naming_topic_partition_and_offset() -> None:
    with pytest.raises(DataLoss, match=r"option startingOffsets: topic 'a' partition 1 offset 3 is below"):
        plan_read_ranges(options(startingOffsets='{"a": {"1": 3}}'), WATERMARKS)
    with pytest.raises(
        OffsetOutOfLog, match=r"option endingOffsets: topic 'b' partition 0 offset 8 is beyond"
    ):
        plan_read_ranges(options(endingOffsets='{"b": {"0": 8}}'), WATERMARKS)
    with pytest.raises(
        ConfigError, match=r"topic 'a' partition 0: startingOffsets 9 is after endingOffsets 4"
    ):
        plan_read_ranges(
            options(startingOffsets='{"a": {"0": 9}}', endingOffsets='{"a": {"0": 4}}'), WATERMARKS
        )
    with pytest.raises(
        ConfigError, match=r"option startingOffsets names 'a' partition 7, which Kafka does not"
    ):
        plan_read_ranges(options(startingOffsets='{"a": {"7": 0}}'), WATERMARKS)


def test_min_partitions_cuts_big_ranges_into_more_tasks() -> None:
    planned = plan_read_ranges(options(minPartitions="6"), WATERMARKS)
    assert len(planned) >= 6
    assert sum(r.size for r in planned) == 8 + 15 + 7


# -- planning for txstore.job ---------------------------------------------------------------


def test_a_job_reads_from_its_committed_offsets_and_unstarted_partitions_from_earliest() -> None:
    committed = {("a", 0): 6, ("a", 1): 20}
    planned = plan_job_ranges("j", committed, WATERMARKS, StartingOffsets())
    # a/1 is caught up; b was never committed: its earliest offset, as the job would start it.
    assert planned == [OffsetRange("a", 0, 6, 10), OffsetRange("b", 0, 0, 7)]


def test_a_job_plan_starts_new_partitions_like_the_job_and_refuses_like_the_job() -> None:
    latest = parse_starting_offsets("latest")
    # A new partition of a topic the job already reads starts at earliest, whatever --starting-offsets says.
    planned = plan_job_ranges("j", {("a", 0): 10}, WATERMARKS, latest)
    assert planned == [OffsetRange("a", 1, 5, 20)]
    with pytest.raises(DataLoss, match=r"job 'j' topic 'a' partition 0: stored offset 1 is below"):
        plan_job_ranges("j", {("a", 0): 1}, WATERMARKS, StartingOffsets())


# -- messages as Arrow ----------------------------------------------------------------------


def test_the_arrow_schema_is_what_pyspark_derives_from_the_kafka_source_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(kafka_source_schema(), timezone="UTC").equals(KAFKA_ARROW_SCHEMA)


def test_messages_become_one_record_batch_with_the_kafka_source_columns() -> None:
    messages = [
        Message(topic="t", partition=3, offset=7, key=None, value=b"v", timestamp=(1, 1700000000123)),
        Message(
            topic="t",
            partition=3,
            offset=9,
            key=b"k",
            value=None,
            headers=[("h", b"1"), ("empty", None)],
            timestamp=(2, 5),
        ),
        Message(topic="u", partition=0, offset=0, key=b"", value=b"", headers=[], timestamp=(0, 0)),
    ]
    batch = messages_to_record_batch(messages)
    assert batch.schema.equals(KAFKA_ARROW_SCHEMA)
    utc = timezone.utc
    assert batch.to_pylist() == [
        {
            "key": None,
            "value": b"v",
            "topic": "t",
            "partition": 3,
            "offset": 7,
            "timestamp": datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc),
            "timestampType": 0,  # create time
            "headers": None,
        },
        {
            "key": b"k",
            "value": None,
            "topic": "t",
            "partition": 3,
            "offset": 9,
            "timestamp": datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=utc),
            "timestampType": 1,  # log-append time
            "headers": [{"key": "h", "value": b"1"}, {"key": "empty", "value": None}],
        },
        {
            "key": b"",
            "value": b"",
            "topic": "u",
            "partition": 0,
            "offset": 0,
            "timestamp": None,  # librdkafka: no timestamp
            "timestampType": -1,
            "headers": [],
        },
    ]


def test_a_one_partition_batch_and_an_empty_batch_keep_the_schema() -> None:
    same = [Message(topic="t", partition=1, offset=o, value=b"x", timestamp=(1, o)) for o in range(3)]
    batch = messages_to_record_batch(same)
    assert batch.schema.equals(KAFKA_ARROW_SCHEMA)
    assert batch.column("topic").to_pylist() == ["t"] * 3
    assert batch.column("partition").to_pylist() == [1] * 3
    assert batch.column("offset").to_pylist() == [0, 1, 2]
    assert batch.column("headers").null_count == 3
    empty = messages_to_record_batch([])
    assert empty.num_rows == 0
    assert empty.schema.equals(KAFKA_ARROW_SCHEMA)


def test_a_range_readers_batch_takes_topic_and_partition_from_the_range_it_reads() -> None:
    same = [Message(topic="t", partition=1, offset=o, value=b"x", timestamp=(1, o)) for o in range(3)]
    schema = arrow_schema(("partition", "topic", "offset"))

    assert messages_to_record_batch(same, source=("t", 1)).equals(messages_to_record_batch(same))
    assert messages_to_record_batch(same, schema, ("t", 1)).equals(messages_to_record_batch(same, schema))
    # The source is what the reader's consumer is assigned: taken as it is, no message is asked.
    assert messages_to_record_batch(same, schema, ("other", 4)).to_pylist() == [
        {"partition": 4, "topic": "other", "offset": o} for o in range(3)
    ]
    assert messages_to_record_batch([], schema, ("t", 1)).schema.equals(schema)


def test_offsets_are_exact_whether_a_batch_is_consecutive_has_holes_or_mixes_partitions() -> None:
    schema = arrow_schema(("offset",))

    def offsets(messages: list[Message], source: tuple[str, int] | None) -> list[int]:
        return messages_to_record_batch(messages, schema, source).column("offset").to_pylist()

    consecutive = [
        Message(topic="t", partition=1, offset=o, value=b"x", timestamp=(1, o)) for o in range(5, 9)
    ]
    assert offsets(consecutive, ("t", 1)) == [5, 6, 7, 8]
    # A transaction marker or a compacted message leaves a hole: the offsets as they are.
    holes = [Message(topic="t", partition=1, offset=o, value=b"x", timestamp=(1, o)) for o in (5, 6, 8, 9)]
    assert offsets(holes, ("t", 1)) == [5, 6, 8, 9]
    # Two partitions whose first and last offsets are as far apart as a range would be: no range.
    mixed = [
        Message(topic="t", partition=p, offset=o, value=b"x", timestamp=(1, o))
        for p, o in ((0, 5), (1, 0), (0, 7))
    ]
    assert offsets(mixed, None) == [5, 0, 7]


def test_only_the_columns_asked_for_are_built_in_the_order_asked() -> None:
    messages = [
        Message(topic="t", partition=3, offset=7, key=b"k", value=b"v", timestamp=(1, 1700000000123)),
        Message(topic="t", partition=3, offset=8, key=None, value=b"w", timestamp=(0, 0)),
    ]
    full = messages_to_record_batch(messages)
    schema = arrow_schema(("timestamp", "offset", "topic"))

    batch = messages_to_record_batch(messages, schema)

    assert batch.schema.equals(schema)
    assert batch.schema.names == ["timestamp", "offset", "topic"]
    assert batch.to_pylist() == full.select(["timestamp", "offset", "topic"]).to_pylist()
    assert messages_to_record_batch([], schema).schema.equals(schema)


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (
            ("topic", "payload"),
            "read_columns: 'payload' is not a Kafka-source column; choose from key, value",
        ),
        ((), "read_columns: no columns; name at least one of key, value"),
        (("key", "key"), "read_columns: a column is named twice: key, key"),
    ],
)
def test_a_column_choice_that_is_not_distinct_kafka_source_columns_is_refused(
    columns: tuple[str, ...], expected: str
) -> None:
    with pytest.raises(ColumnsInvalid) as caught:
        check_columns(columns, "read_columns")
    assert str(caught.value).startswith(expected)


def test_batches_are_joined_into_batches_of_about_the_rows_asked_in_order() -> None:
    batches = [
        messages_to_record_batch(
            [Message(topic="t", partition=0, offset=o, value=b"x", timestamp=(1, o)) for o in range(s, s + 3)]
        )
        for s in range(0, 30, 3)
    ]
    joined = list(coalesce(batches, rows=7))
    assert [b.num_rows for b in joined] == [9, 9, 9, 3]
    assert [o for b in joined for o in b.column("offset").to_pylist()] == list(range(30))
    assert all(b.schema.equals(KAFKA_ARROW_SCHEMA) for b in joined)
    # Big values: the byte bound comes first.
    by_bytes = list(coalesce(batches, rows=1_000, max_bytes=2 * batches[0].nbytes))
    assert [b.num_rows for b in by_bytes] == [6] * 5
    assert [o for b in by_bytes for o in b.column("offset").to_pylist()] == list(range(30))


def struct(*fields: tuple[str, Any, bool]) -> Any:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, kind, nullable) for name, kind, nullable in fields])


def test_a_declared_schema_names_the_columns_read_in_its_order_nullability_aside() -> None:
    from pyspark.sql.types import BinaryType, IntegerType, StringType, TimestampType

    declared = struct(
        ("timestamp", TimestampType(), True),
        ("partition", IntegerType(), True),  # NOT NULL in the source: nullable is fine
        ("key", BinaryType(), True),
        ("topic", StringType(), False),
    )
    assert schema_columns(declared) == ("timestamp", "partition", "key", "topic")
    assert schema_columns(kafka_source_schema()) == tuple(KAFKA_ARROW_SCHEMA.names)


def test_a_declared_headers_column_needs_include_headers() -> None:
    declared = kafka_source_schema(("topic", "headers"))
    assert schema_columns(declared, include_headers=True) == ("topic", "headers")
    with pytest.raises(ConfigError) as caught:
        schema_columns(declared, include_headers=False)
    assert str(caught.value) == (
        "schema: column headers is there only with .option('includeHeaders', 'true'), as in Spark's "
        "Kafka source; add the option or leave headers out of the schema"
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            (("topic", "string", True), ("payload", "binary", True)),
            "schema: 'payload' is not a column of format('txstore'); name some of key, value, topic, "
            "partition, offset, timestamp, timestampType, headers, or leave out .schema() for all of them",
        ),
        (
            (("key", "string", True),),
            "schema: column key is binary, not string; declare it as key binary and cast it after load()",
        ),
        (
            (("offset", "int", True),),
            "schema: column offset is bigint, not int; declare it as offset bigint and cast it after load()",
        ),
        ((("value", "binary", False),), "schema: column value can be null; do not declare it NOT NULL"),
        ((("key", "binary", True), ("key", "binary", True)), "schema: a column is named twice: key, key"),
        ((), "schema: no columns; name at least one, or leave out .schema() for all of them"),
    ],
)
def test_a_declared_schema_outside_the_kafka_source_columns_is_one_line(
    fields: tuple[tuple[str, str, bool], ...], expected: str
) -> None:
    from pyspark.sql.types import BinaryType, IntegerType, StringType

    kinds = {"string": StringType(), "binary": BinaryType(), "int": IntegerType()}
    with pytest.raises(ConfigError) as caught:
        schema_columns(struct(*((name, kinds[kind], nullable) for name, kind, nullable in fields)))
    assert str(caught.value) == expected

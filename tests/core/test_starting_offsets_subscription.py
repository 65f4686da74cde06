"""Starting offsets JSON naming a partition Kafka does not report: the line names the way the job
subscribes (``--topic``, ``--topic-pattern`` or ``--assign``; the data source's ``subscribe``,
``subscribePattern`` or ``assign``), the setting the user should check.

No Spark, no broker: the job's :class:`~txstore.planning.Planner` with Kafka's answers given, and
the data source's batch read of a ``txstore.job`` and its stream source called as Spark calls
them over a fake of confluent-kafka (tests/helpers/fake_kafka.py);
real PostgreSQL (one database for the module, emptied before each test, tests/helpers/fast_db.py).

Kafka reports one partition of topic ``t`` (0); the JSON also names partition 7. With an
assignment the JSON must name exactly the assigned partitions and an assigned partition Kafka
does not report is refused earlier unless the job counted it, so there the job holds a row of
partition 7 (a partition Kafka no longer reports).
"""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers.fake_kafka import FakeKafka, FakeLog, install_with_admin
from tests.helpers.fast_db import module_database
from tests.helpers.streams import ROWS_SCHEMA
from tests.postgres.test_sink import seed
from txstore.core.errors import ConfigError
from txstore.core.ranges import PartitionWatermarks
from txstore.core.starting import parse_starting_offsets
from txstore.planning import Planner
from txstore.postgres.db import connect
from txstore.settings import JobSettings
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.read_planning import plan
from txstore.spark.stream.stream_source import TxstoreStreamReader, stream_reader

JOB = "unknown_start"
JSON = '{"t": {"0": -2, "7": 3}}'
MARKS = [PartitionWatermarks("t", 0, 0, 4)]


shared_database_url, database_url = module_database("unknown_start")


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    fake = install_with_admin(monkeypatch)
    fake.add(FakeLog.of("t", 0, range(4)))
    return fake


@pytest.mark.parametrize(
    ("way", "flag"), [("topics", "--topic"), ("pattern", "--topic-pattern"), ("assignment", "--assign")]
)
def test_a_job_s_starting_offsets_naming_a_partition_kafka_lacks_say_to_check_the_flag_it_subscribes_by(
    database_url: str, db: psycopg.Connection, way: str, flag: str
) -> None:
    subscription: dict[str, object] = {
        "topics": {"topics": ("t",)},
        "pattern": {"topics": (), "topic_pattern": "t"},
        "assignment": {"topics": ("t",), "assignment": {"t": (0, 7)}},
    }[way]
    if way == "assignment":
        seed(db, JOB, "t", {7: 3})
    settings = JobSettings(
        job=JOB,
        bootstrap_servers="fake:9092",
        database_url=database_url,
        starting_offsets=parse_starting_offsets(JSON),
        **subscription,  # type: ignore[arg-type]
    )
    planner = Planner(settings, lambda conf, topics: list(MARKS), topic_names=lambda conf: ["t"])
    with connect(database_url) as conn, pytest.raises(ConfigError) as e:
        planner.plan(lambda: conn)
    assert str(e.value) == (
        "--starting-offsets names 't' partition 7, which Kafka does not report for the job's topics; "
        f"check the topic names ({flag}) and partition numbers"
    )


@pytest.mark.parametrize(
    ("option", "value"), [("subscribe", "t"), ("subscribePattern", "t"), ("assign", '{"t": [0, 7]}')]
)
@pytest.mark.parametrize(
    ("setting", "given", "whose"),
    [
        ("startingOffsets", JSON, "the job's topics"),
        ("startingOffsetsByTimestamp", '{"t": {"0": 1000, "7": 1000}}', "the topics read"),
    ],
)
def test_a_stream_s_starting_offsets_or_times_naming_a_partition_kafka_lacks_say_to_check_the_option_it_subscribes_by(
    fake_kafka: FakeKafka,
    database_url: str,
    db: psycopg.Connection,
    readers: list[TxstoreStreamReader],
    option: str,
    value: str,
    setting: str,
    given: str,
    whose: str,
) -> None:
    if option == "assign":
        seed(db, JOB, "t", {7: 3})
    reader = stream_reader(
        {
            "kafka.bootstrap.servers": "fake:9092",
            option: value,
            setting: given,
            "txstore.job": JOB,
            "txstore.databaseUrl": database_url,
        },
        ROWS_SCHEMA,
    )
    readers.append(reader)
    with pytest.raises(ConfigError) as e:
        reader.initialOffset()
    assert str(e.value) == (
        f"option {setting} names 't' partition 7, which Kafka does not report for {whose}; "
        f"check the topic names ({option}) and partition numbers"
    )


@pytest.mark.parametrize(
    ("option", "value"), [("subscribe", "t"), ("subscribePattern", "t"), ("assign", '{"t": [0, 7]}')]
)
def test_a_job_s_batch_read_refuses_starting_offsets_naming_a_partition_kafka_lacks_by_its_options(
    fake_kafka: FakeKafka, database_url: str, db: psycopg.Connection, option: str, value: str
) -> None:
    """``read.format("txstore")`` with ``txstore.job`` plans as the job does: the line names the
    read's options (startingOffsets and the one it subscribes by), not the job's flags."""
    if option == "assign":
        seed(db, JOB, "t", {7: 3})
    options = parse_read_options(
        {
            "kafka.bootstrap.servers": "fake:9092",
            option: value,
            "startingOffsets": JSON,
            "txstore.job": JOB,
            "txstore.databaseUrl": database_url,
        },
        {},
    )
    with pytest.raises(ConfigError) as e:
        plan(options)
    assert str(e.value) == (
        "option startingOffsets names 't' partition 7, which Kafka does not report for the job's topics; "
        f"check the topic names ({option}) and partition numbers"
    )


def test_a_plain_batch_read_s_starting_times_naming_a_partition_kafka_lacks_name_its_option(
    fake_kafka: FakeKafka,
) -> None:
    options = parse_read_options(
        {
            "kafka.bootstrap.servers": "fake:9092",
            "subscribePattern": "t",
            "startingOffsetsByTimestamp": '{"t": {"0": 1000, "7": 1000}}',
        },
        {},
    )
    with pytest.raises(ConfigError) as e:
        plan(options)
    assert str(e.value) == (
        "option startingOffsetsByTimestamp names 't' partition 7, which Kafka does not report for the "
        "topics read; check the topic names (subscribePattern) and partition numbers"
    )

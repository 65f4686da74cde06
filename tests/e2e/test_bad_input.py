"""Bad input never corrupts anything.

Each bad input ends `python jobs/count_topic.py` with exit code 1 and one
line on stderr that names the problem and what to do, without a traceback,
and leaves txn_offsets, txn_data and txn_lost_ranges exactly as they were.
Odd but valid data (binary keys and values, null keys, 1 MiB messages) is
counted exactly.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.conftest import produce
from tests.helpers.counting import BrokerDb, Counting
from tests.helpers.job_processes import count_topic_args, operator_cli, run_job
from tests.helpers.local import free_port
from tests.postgres.test_schema import tables
from txstore.core.errors import ConfigError
from txstore.job import JobSettings
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.postgres.migrate import SCHEMA_REVISION, upgrade
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

KAFKA_HINT = (
    "check --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS, the network, and --kafka-option security settings"
)
STARTING_HINT = 'use earliest, latest or JSON like {"mytopic": {"0": 23, "1": -2}}'
TOPIC_RULE = "is not a valid Kafka topic name: use 1 to 249 letters, digits, '.', '_' and '-'"


def snapshot(db: psycopg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the txstore tables."""
    return {
        table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3, 4").fetchall()
        for table in ("txn_offsets", "txn_data", "txn_lost_ranges")
    }


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The job's one-line error, after checking the exit code and that no traceback was printed."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def refused(broker_db: BrokerDb, topic: str, *flags: str) -> str:
    """The one-line error of count_topic run on ``topic`` with ``flags``, after checking that the
    run left the txstore tables as they were."""
    before = snapshot(broker_db.db)
    result = run_job(*count_topic_args(broker_db.kafka, broker_db.database_url, topic, *flags))
    line = error_line(result)
    assert snapshot(broker_db.db) == before
    return line


@pytest.fixture
def counted_topic(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> str:
    """A 2-partition topic already counted once by count_topic, so the tables hold rows."""
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 5, 1: 7})
    db.execute(
        "INSERT INTO txn_offsets (job, topic, part, off) VALUES ('count_topic', %s, 0, 5), ('count_topic', %s, 1, 7)",
        (topic, topic),
    )
    db.execute(
        "INSERT INTO txn_data (job, topic, grain, metric) VALUES ('count_topic', %s, 'topic', 12)", (topic,)
    )
    produce(kafka.bootstrap_servers, topic, {0: 1})  # new data a bad run must not count
    return topic


def schema_refusal(kafka: MockKafkaCluster, database_url: str, topic: str) -> str:
    """count_topic's one-line error for ``topic`` (3 messages are there to count) in a database
    without the schema this txstore needs."""
    produce(kafka.bootstrap_servers, topic, {0: 3})
    return error_line(run_job(*count_topic_args(kafka, database_url, topic, "--once")))


def test_a_missing_schema_names_the_command_to_run_and_creates_nothing(
    kafka: MockKafkaCluster, empty_database_url: str, new_topic: Callable[..., str]
) -> None:
    assert schema_refusal(kafka, empty_database_url, new_topic(1)) == (
        f"count_topic: error: the txstore tables are missing in {empty_database_url}; "
        "run `txstore db upgrade` with TXSTORE_DATABASE_URL set to that database"
    )
    assert tables(empty_database_url) == set()


def test_an_older_schema_names_both_revisions_and_the_upgrade_and_writes_nothing(
    kafka: MockKafkaCluster, empty_database_url: str, new_topic: Callable[..., str]
) -> None:
    upgrade(empty_database_url, "0001")
    assert schema_refusal(kafka, empty_database_url, new_topic(1)) == (
        f"count_topic: error: the database schema is at revision 0001 but this txstore needs {SCHEMA_REVISION}; "
        "run `txstore db upgrade` (or upgrade txstore if the database is newer)"
    )
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM txn_offsets").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM txn_data").fetchone() == (0,)
    assert "txn_lost_ranges" not in tables(empty_database_url)


def test_unreachable_kafka_times_out_with_the_brokers_complaint_and_writes_nothing(
    database_url: str, db: psycopg.Connection, counted_topic: str
) -> None:
    before = snapshot(db)
    nobody = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_job(
        "--bootstrap-servers", nobody, "--database-url", database_url, "--topic", counted_topic, "--once"
    )
    elapsed = time.monotonic() - started
    line = error_line(result)
    assert line.startswith(
        f"count_topic: error: Kafka at {nobody} did not answer a metadata request within "
        f"{METADATA_TIMEOUT_SECONDS:g}s ({nobody}/bootstrap: Connect to ipv4#{nobody} failed: Connection refused"
    ), line
    assert line.endswith(f"); {KAFKA_HINT}"), line
    # librdkafka's own retry lines (many a second) are not shown without --verbose.
    assert "Connection refused" not in result.stderr.replace(line, ""), result.stderr[-3000:]
    assert METADATA_TIMEOUT_SECONDS <= elapsed < METADATA_TIMEOUT_SECONDS + 120
    assert snapshot(db) == before


def test_an_unknown_topic_is_named_and_never_created(broker_db: BrokerDb, counted_topic: str) -> None:
    kafka, missing = broker_db.kafka, f"{counted_topic}-typo"
    assert refused(broker_db, counted_topic, "--topic", missing, "--once") == (
        f"count_topic: error: topic {missing!r} does not exist on Kafka at {kafka.bootstrap_servers}; "
        "check --topic (txstore never creates topics)"
    )
    # The broker auto-creates topics for clients that allow it; the job's requests did not.
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "allow.auto.create.topics": False})
    assert admin.list_topics(missing, timeout=10).topics[missing].error is not None


@pytest.mark.parametrize(
    ("starting", "message"),
    [
        (
            "{oops",
            "--starting-offsets is not valid JSON (Expecting property name enclosed in double quotes "
            f"at char 1); {STARTING_HINT}",
        ),
        ("[1, 2]", f"--starting-offsets JSON must be a non-empty object; {STARTING_HINT}"),
        (
            '{"t": {"zero": 1}}',
            f"--starting-offsets: partition 'zero' of topic 't' is not a number; {STARTING_HINT}",
        ),
        (
            '{"t": {"0": -3}}',
            "--starting-offsets: topic 't' partition 0: offset -3 must be an offset >= 0, -2 (earliest) "
            "or -1 (latest)",
        ),
    ],
)
def test_malformed_starting_offsets_are_refused_before_anything_runs(
    broker_db: BrokerDb, counted_topic: str, starting: str, message: str
) -> None:
    line = refused(broker_db, counted_topic, "--starting-offsets", starting)
    assert line == f"count_topic: error: {message}"


def test_starting_offsets_naming_partitions_kafka_does_not_have_are_refused_and_start_nothing(
    broker_db: BrokerDb,
) -> None:
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 4, 1: 4})
    starting = f'{{"{topic}": {{"0": 1, "7": 0}}, "other": {{"0": 0}}}}'
    # The tables stay as they were: not even the start rows of the partitions that exist.
    assert refused(broker_db, topic, "--starting-offsets", starting, "--once") == (
        f"count_topic: error: --starting-offsets names 'other' partition 0, {topic!r} partition 7, "
        "which Kafka does not report for the job's topics; check the topic names (--topic) and partition numbers"
    )


@pytest.mark.parametrize("interval", ["0", "-5", "nan"])
def test_an_interval_that_is_not_above_zero_is_refused(
    broker_db: BrokerDb, counted_topic: str, interval: str
) -> None:
    assert refused(broker_db, counted_topic, "--interval", interval) == (
        f"count_topic: error: --interval must be a number of seconds above 0, got {float(interval):g}"
    )


@pytest.mark.parametrize(
    "topic",
    [
        "x'; DROP TABLE txn_data; --",
        "two words",
        'quo"ted',
        "it's",
        "semi;colon",
        "ünïcode",
        "t" * 250,
    ],
)
def test_topic_names_kafka_cannot_have_are_refused_before_anything_runs(
    broker_db: BrokerDb, counted_topic: str, topic: str
) -> None:
    line = refused(broker_db, counted_topic, "--topic", topic, "--once")
    assert line == f"count_topic: error: --topic {topic!r} {TOPIC_RULE}"
    assert tables(broker_db.database_url) >= {"txn_offsets", "txn_data", "txn_lost_ranges"}


def test_a_reset_of_a_topic_kafka_cannot_have_is_refused_and_changes_nothing(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, counted_topic: str
) -> None:
    before = snapshot(db)
    topic = "x'; UPDATE txn_offsets SET off = 0; --"
    result = operator_cli(
        *("reset", "--database-url", database_url, "--bootstrap-servers", kafka.bootstrap_servers),
        *("--job", "count_topic", "--topic", topic, "--to-earliest", "--execute"),
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"txstore: error: --topic {topic!r} {TOPIC_RULE}"
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("topic", "message"),
    [("", "--topic must not be empty"), (".", "--topic '.' is not allowed as a Kafka topic name")],
)
def test_empty_and_dot_topic_names_are_refused(
    broker_db: BrokerDb, counted_topic: str, topic: str, message: str
) -> None:
    assert refused(broker_db, counted_topic, "--topic", topic, "--once") == f"count_topic: error: {message}"


def test_sql_in_a_job_name_is_stored_as_text_and_never_run(counting: Counting) -> None:
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 3, 1: 4})
    job = "x'); DROP TABLE txn_data; --"
    counting.job(topic, job=job).run_batch()
    counting.assert_counted_exactly(topic, 7, job=job)
    assert tables(counting.database_url) >= {"txn_offsets", "txn_data", "txn_lost_ranges"}


def test_unknown_kafka_options_are_refused_with_the_setting_named(kafka: MockKafkaCluster) -> None:
    conf = client_config(kafka.bootstrap_servers, {"securty.protocol": "SSL"})
    with pytest.raises(ConfigError) as refused:
        fetch_watermarks(conf, ["any"])
    assert str(refused.value) == (
        'Kafka client settings refused: No such configuration property: "securty.protocol"; check --kafka-option'
    )


@pytest.mark.parametrize(
    ("option", "fixed"),
    [
        ("isolation.level=read_uncommitted", "isolation.level=read_committed"),
        ("enable.auto.commit=true", "enable.auto.commit=false"),
        ("enable.auto.offset.store=true", "enable.auto.offset.store=false"),
        ("auto.offset.reset=earliest", "auto.offset.reset=error"),
        ("enable.partition.eof=false", "enable.partition.eof=true"),
    ],
)
def test_kafka_options_that_would_change_what_is_read_are_refused_and_nothing_is_written(
    broker_db: BrokerDb, counted_topic: str, option: str, fixed: str
) -> None:
    assert refused(broker_db, counted_topic, "--kafka-option", option, "--once") == (
        f"count_topic: error: --kafka-option {option} is refused: txstore sets {fixed} itself, "
        "which exact counts rely on; remove the option"
    )
    with pytest.raises(ConfigError, match=f"--kafka-option {option} is refused"):  # the library path too
        JobSettings(
            "count_topic",
            (counted_topic,),
            broker_db.kafka.bootstrap_servers,
            broker_db.database_url,
            kafka_options=dict([option.split("=")]),
        )


@pytest.mark.parametrize("option", ["group.id", "GROUP.ID", "group.instance.id"])
def test_a_consumer_group_kafka_option_is_refused_naming_the_mirror_flag(option: str) -> None:
    """Spark's source refuses kafka.group.id (format('txstore') too): a job's readers join no group,
    so a group named there would never be used; the mirror to a group is its own flag."""
    with pytest.raises(ConfigError) as caught:
        JobSettings(
            "count_topic", ("t",), "k:9092", "postgresql://u@h/d", kafka_options={option: "analytics"}
        )
    assert str(caught.value) == (
        f"--kafka-option {option} is refused: txstore's readers join and commit to no Kafka consumer "
        "group (a job's offsets are in PostgreSQL, txn_offsets); to mirror them to a group for Kafka's "
        "tooling, give --commit-to-kafka-group GROUP instead"
    )
    assert "analytics" not in str(caught.value)


def test_a_java_client_only_kafka_option_is_refused_naming_the_pem_settings_librdkafka_takes() -> None:
    with pytest.raises(ConfigError) as caught:
        JobSettings(
            "count_topic",
            ("t",),
            "k:9092",
            "postgresql://u@h/d",
            kafka_options={
                "ssl.truststore.location": "/etc/kafka/trust.jks",
                "ssl.truststore.password": "pw1",
            },
        )
    text = str(caught.value)
    assert text == (
        "--kafka-option ssl.truststore.location is a setting of Kafka's Java client that librdkafka, "
        "txstore's Kafka client, does not take; give --kafka-option ssl.ca.location instead (the CA "
        "certificates as a PEM file)"
    )
    with pytest.raises(ConfigError, match=r"^--kafka-option ssl.keystore.location \(a .jks file\) is"):
        client_config("k:9092", {"ssl.keystore.location": "/k/client.jks", "ssl.keystore.password": "pw1"})


def test_binary_and_null_keys_binary_values_and_one_mib_messages_are_counted_exactly(
    counting: Counting,
) -> None:
    topic = counting.new_topic(2)
    one_mib = bytes(range(256)) * 4096  # 1 MiB, mostly not UTF-8
    assert len(one_mib) == 1 << 20
    producer = Producer(
        {
            "bootstrap.servers": counting.kafka.bootstrap_servers,
            "message.max.bytes": 4 << 20,
            "enable.idempotence": True,
        }
    )
    failed: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err:
            failed.append(err)

    # The test broker keeps 5 MiB per partition, so 3 big messages fit with room to spare.
    for key in (None, b"\xff\xfe\xfd", b""):
        producer.produce(topic, value=one_mib, key=key, partition=0, on_delivery=on_delivery)
    odd: list[tuple[bytes | None, bytes | None]] = [
        (None, b"\xc3\x28"),  # null key, invalid UTF-8
        (b"\x80\x81", None),  # tombstone
        (None, None),
        (b"\x00", b""),
        ("ключ".encode("utf-16"), "значение".encode("cp1251")),
    ]
    for i in range(100):
        key, value = odd[i % len(odd)]
        producer.produce(topic, value=value, key=key, partition=1, on_delivery=on_delivery)
    assert producer.flush(60) == 0 and not failed, failed

    report = counting.job(topic).run_batch()
    assert report.messages == 103
    assert counting.totals(topic) == {topic: 103}
    assert counting.offsets(topic) == counting.log_ends(topic) == {0: 3, 1: 100}


@pytest.mark.parametrize("password", ["se@cret", "a@b@c"])
def test_a_password_with_an_at_sign_not_percent_encoded_is_one_line_saying_to_encode_it(
    database_url: str, password: str
) -> None:
    from urllib.parse import urlsplit

    given = urlsplit(database_url)
    url = f"postgresql://{given.username}:{password}@{given.hostname}:{given.port}{given.path}"
    result = operator_cli("jobs", "--database-url", url)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"txstore: error: cannot connect to PostgreSQL at postgresql://{given.username}:***@"
        f"{given.hostname}:{given.port}{given.path}: the user name or password holds an '@' that "
        "is not percent-encoded, so the host was read from the password; percent-encode it "
        "(@ as %40, : as %3A, / as %2F, % as %25, # as %23, ? as %3F)\n"
    )
    assert "cret" not in result.stderr and "b@c" not in result.stderr

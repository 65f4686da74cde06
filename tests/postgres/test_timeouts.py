"""Nothing waits forever on PostgreSQL: isolation, server timeouts, and a frozen network.

Every connection txstore opens is READ COMMITTED whatever the server's
default, carries statement, lock and idle-in-transaction timeouts, and
notices a peer that stopped answering through TCP keepalives and
``tcp_user_timeout``. The frozen network is real: the job reaches PostgreSQL
through the chaos proxy in a network namespace of its own, whose link is
taken down (packets dropped, sockets left open), so the client's kernel sees
exactly what a frozen network shows it.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.chaos.proxy import TcpProxy, frozen_network_available
from tests.conftest import produce
from tests.helpers.counting import assert_counted_exactly, job_for
from txstore.core.errors import DatabaseUnavailable, KafkaReadError, TxstoreError
from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import IDLE_TIMEOUT_SECONDS, RangeReader
from txstore.postgres.db import (
    FROZEN_PEER_BOUND_SECONDS,
    TCP_USER_TIMEOUT_MS,
    connect,
    forget_worker_connection,
    worker_connection,
)
from txstore.postgres.sink import TransactionalSink
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.slow  # each test waits out a timeout (seconds to a minute)
needs_namespaces = pytest.mark.skipif(
    not frozen_network_available(), reason="freezing a network needs root and Linux network namespaces"
)

# A frozen connection fails in seconds here, not in the defaults' half minute.
FAST_FAILURE = {
    "connect_timeout": "2",
    "keepalives_idle": "1",
    "keepalives_interval": "1",
    "keepalives_count": "2",
    "tcp_user_timeout": "2000",
    # The server's end of a frozen connection is the live proxy, so only this ends
    # the orphaned transaction (and frees its row locks) while the network is down.
    "options": "-c idle_in_transaction_session_timeout=5s",
}
FAST_BATCH_FAILURE_SECONDS = 30
"""One frozen task attempt: the 3 s stall below + 2 s tcp_user_timeout; then Spark's three
retries, each failing its connect within connect_timeout (2 s); plus Spark's own overhead."""


def database_name(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def through(proxy: TcpProxy, url: str, **params: str) -> str:
    """``url`` with the proxy as its host, plus libpq ``params``."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    auth = info.get("user", "postgres") + (f":{info['password']}" if info.get("password") else "")
    query = f"?{urllib.parse.urlencode(params, quote_via=urllib.parse.quote)}" if params else ""
    return f"postgresql://{auth}@{proxy.host}:{proxy.port}/{info['dbname']}{query}"


def settings_of(conn: psycopg.Connection) -> dict[str, str]:
    names = (
        "default_transaction_isolation",
        "transaction_isolation",
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "tcp_keepalives_idle",
        "tcp_user_timeout",
    )
    found = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]
    conn.rollback()
    params = conn.info.get_parameters()
    found.update({k: params.get(k, "") for k in ("keepalives", "keepalives_idle")})
    found["libpq tcp_user_timeout"] = params.get("tcp_user_timeout", "")
    return found


@pytest.fixture
def serializable_database_url(database_url: str, db: psycopg.Connection) -> str:
    """The test database, with every new session defaulting to SERIALIZABLE."""
    db.execute(
        f"ALTER DATABASE {database_name(database_url)} SET default_transaction_isolation = 'serializable'"
    )
    return database_url


def test_every_connection_is_read_committed_and_bounded_whatever_the_server_default(
    serializable_database_url: str,
) -> None:
    url = serializable_database_url
    with psycopg.connect(url) as plain:  # what the server gives a connection by default
        assert plain.execute("SHOW default_transaction_isolation").fetchone() == ("serializable",)
    job = TransactionalJob(None, JobSettings("j", ("t",), "127.0.0.1:1", url), count_messages)
    try:
        driver = job._connection()
        worker = worker_connection(url)
        for conn in (driver, worker, connect(url, autocommit=True)):
            assert settings_of(conn) == {
                "default_transaction_isolation": "read committed",
                "transaction_isolation": "read committed",
                "statement_timeout": "5min",
                "lock_timeout": "1min",
                "idle_in_transaction_session_timeout": "10min",
                # The server's end of the (TCP) connection watches for a frozen client too.
                "tcp_keepalives_idle": "15",
                "tcp_user_timeout": "30000",  # milliseconds
                "keepalives": "1",
                "keepalives_idle": "15",
                "libpq tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
            }
    finally:
        job.close()
        forget_worker_connection(url)


def test_the_urls_own_settings_win_except_the_isolation_level(serializable_database_url: str) -> None:
    options = "-c statement_timeout=7s -c lock_timeout=0 -c default_transaction_isolation=serializable"
    url = f"{serializable_database_url}?keepalives_idle=4&tcp_user_timeout=1234&options={urllib.parse.quote(options)}"
    with connect(url) as conn:
        found = settings_of(conn)
    assert found["statement_timeout"] == "7s"
    assert found["lock_timeout"] == "0"
    assert found["idle_in_transaction_session_timeout"] == "10min"  # not in the URL: the default
    assert found["keepalives_idle"] == "4"
    assert found["libpq tcp_user_timeout"] == "1234"
    assert found["transaction_isolation"] == "read committed"


def test_concurrent_commits_to_one_topic_total_all_succeed_on_a_serializable_database(
    serializable_database_url: str, db: psycopg.Connection
) -> None:
    """Two commits add to the same topic-total row at once: the second waits for the first's
    row lock. Under SERIALIZABLE it would then fail ("could not serialize access due to
    concurrent update"); under READ COMMITTED it adds to the committed value."""
    url = serializable_database_url
    db.execute("INSERT INTO txn_offsets (job, topic, part, off) VALUES ('j', 't', 0, 0), ('j', 't', 1, 0)")
    errors: list[BaseException] = []

    def commit(partition: int, stall: str) -> None:
        try:
            with connect(url) as conn:
                sink = TransactionalSink(conn, "j", FailPoints.parse(stall) if stall else None)
                sink.commit(OffsetRange("t", partition, 0, 10 + partition), {TOPIC_TOTAL: 10 + partition})
        except BaseException as e:
            errors.append(e)

    first = threading.Thread(target=commit, args=(0, "before-commit:sleep=1.5"))
    first.start()
    time.sleep(0.5)  # the first holds the topic-total row's lock, stalled before COMMIT
    commit(1, "")
    first.join(30)
    assert errors == []
    assert db.execute("SELECT metric FROM txn_data WHERE job = 'j' AND topic = 't'").fetchone() == (21,)
    assert dict(db.execute("SELECT part, off FROM txn_offsets WHERE job = 'j'").fetchall()) == {0: 10, 1: 11}


@pytest.fixture
def frozen_proxy() -> Iterator[TcpProxy]:
    from tests.helpers import pg_server

    server = pg_server.address()
    with TcpProxy(server.host, server.port, frozen_network=True) as proxy:
        yield proxy


def in_transaction(db: psycopg.Connection, database_url: str) -> bool:
    """Whether some txstore session of the test database is idle inside a transaction."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txstore' "
        "AND datname = %s AND state = 'idle in transaction'",
        (database_name(database_url),),
    ).fetchone()
    return row is not None and row[0] > 0


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@needs_namespaces
def test_a_frozen_network_fails_a_planning_query_within_the_default_bound_and_the_next_one_works(
    kafka: MockKafkaCluster, database_url: str, frozen_proxy: TcpProxy, new_topic: Callable[..., str]
) -> None:
    """The defaults, unchanged: a query sent into a frozen network fails after
    tcp_user_timeout (30 s), not after the kernel's own retransmissions (15 minutes)."""
    topic = new_topic(1)
    job = TransactionalJob(
        None,
        JobSettings("j", (topic,), kafka.bootstrap_servers, through(frozen_proxy, database_url)),
        count_messages,
    )
    failed: list[BaseException] = []
    try:
        job._connection()  # connected, schema checked, job lock held: idle between batches
        frozen_proxy.freeze()
        started = time.monotonic()
        planning = threading.Thread(target=lambda: failed.append(_raised(job.plan)), daemon=True)
        planning.start()
        planning.join(FROZEN_PEER_BOUND_SECONDS + 15)
        elapsed = time.monotonic() - started
        assert not planning.is_alive(), f"planning still hangs {elapsed:.0f}s into the freeze"
        assert isinstance(failed[0], DatabaseUnavailable), failed
        assert str(failed[0]).startswith("planning job 'j' failed in PostgreSQL: ")
        assert elapsed < FROZEN_PEER_BOUND_SECONDS + 5
        frozen_proxy.thaw()
        assert job.plan() == []  # a new connection once the network is back
    finally:
        frozen_proxy.thaw()
        job.close()


def _raised(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except BaseException as e:
        return e
    return None


@needs_namespaces
@pytest.mark.spark
def test_a_batch_whose_database_freezes_mid_commit_fails_in_seconds_and_the_next_run_counts_exactly(
    spark: Any,
    kafka: MockKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    frozen_proxy: TcpProxy,
    new_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 40, 1: 60})
    url = through(frozen_proxy, database_url, **FAST_FAILURE)
    # Each task's first attempt stalls inside its commit transaction: the freeze lands there.
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "before-commit:sleep=3@first")
    job = job_for(spark, kafka, url, topic)
    monkeypatch.delenv("TXSTORE_FAILPOINTS")
    outcome: list[BaseException | None] = []
    batch = threading.Thread(target=lambda: outcome.append(_raised(job.run_batch)), daemon=True)
    try:
        batch.start()
        wait_for(
            lambda: bool(outcome) or in_transaction(db, database_url),
            120,
            "a task inside its commit transaction",
        )
        assert not outcome, outcome  # the batch must still be running
        frozen_proxy.freeze()
        started = time.monotonic()
        batch.join(FAST_BATCH_FAILURE_SECONDS + 30)
        elapsed = time.monotonic() - started
        assert not batch.is_alive(), f"the batch still hangs {elapsed:.0f}s into the freeze"
        assert isinstance(outcome[0], TxstoreError) and outcome[0].transient, outcome
        assert elapsed < FAST_BATCH_FAILURE_SECONDS
    finally:
        frozen_proxy.thaw()
        job.close()
    # The network is back: the next run commits what is missing, exactly once.
    with job_for(spark, kafka, url, topic) as again:
        again.run()
    assert_counted_exactly(db, kafka, topic, 100)


def test_a_read_from_a_broker_that_went_away_fails_within_the_default_idle_timeout(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """The mock broker cannot be frozen behind the proxy (it tells clients its own address,
    so only the bootstrap connection would go through the proxy); down is the nearest."""
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 10})
    kafka.set_broker_down(1)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaReadError, match=rf"no data from Kafka .* for {IDLE_TIMEOUT_SECONDS:g}s"):
            for _ in RangeReader(client_config(kafka.bootstrap_servers), OffsetRange(topic, 0, 0, 10)):
                pass
    finally:
        kafka.set_broker_up(1)
    # A fresh consumer first waits up to the metadata timeout for the topic, then the idle timeout.
    assert time.monotonic() - started < METADATA_TIMEOUT_SECONDS + IDLE_TIMEOUT_SECONDS + 5

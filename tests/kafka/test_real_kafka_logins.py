"""Logging in to real Apache Kafka: TLS and SASL/SCRAM on the session broker's SASL_SSL listener.

The broker (tests/helpers/real_kafka_fixture.py) has a certificate for 127.0.0.1 signed by a CA made
when it started, and one SCRAM-SHA-512 user. txstore passes ``--kafka-option`` settings to
every client it makes (planning, Spark tasks' readers, topic IDs), so a job given the right
login counts exactly; a wrong password, or a client that does not trust the broker's
certificate, stops the job in one line naming the broker and what failed, before anything
is written to PostgreSQL; ``txstore publish`` stops the same way, leaving its results waiting.
An expired certificate and one for another host name (the broker's EXPIRED and OTHER_HOST
listeners, signed by the trusted CA) are told apart from an untrusted CA.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.helpers.cli import txstore
from tests.helpers.counting import Counting
from tests.helpers.real_kafka_fixture import SCRAM_PASSWORD, SCRAM_USER
from tests.helpers.recreated import snapshot
from tests.postgres.test_idempotent_and_outbox import read_topic
from tests.postgres.test_sink import seed
from txstore.core.errors import KafkaUnavailable
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.kafka.certificates import CHECK_TIMEOUT_SECONDS, certificate_refusal
from txstore.postgres.db import connect
from txstore.postgres.outbox import outbox_counts
from txstore.postgres.sink import TransactionalSink
from txstore.testing.kafka_tls import EXPIRED, OTHER_HOST
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark


def secure_settings(
    kafka: RealKafkaCluster,
    database_url: str,
    topic: str,
    options: dict[str, str],
    servers: str | None = None,
) -> JobSettings:
    """count_topic's settings for ``topic`` through the SASL_SSL listener (or ``servers``) with ``options``."""
    return JobSettings(
        "count_topic",
        (topic,),
        servers or kafka.secure_bootstrap_servers,
        database_url,
        kafka_options=options,
    )


def refused_at_once(counting: Counting, settings: JobSettings) -> str:
    """The line a batch of the job with ``settings`` stops with as Kafka refuses it: one line, at
    once (not after waiting for an answer that came), PostgreSQL left as it was."""
    before = snapshot(counting.db)
    started = time.monotonic()
    with (
        pytest.raises(KafkaUnavailable) as raised,
        TransactionalJob(counting.spark, settings, count_messages) as job,
    ):
        job.run_batch()
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "\n" not in message
    assert snapshot(counting.db) == before
    assert elapsed < METADATA_TIMEOUT_SECONDS / 2
    return message


def test_the_right_password_and_certificate_count_exactly_over_sasl_ssl(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    topic = real_counting.new_topic(3, prefix="login")
    options = real_kafka.sasl_ssl_options(SCRAM_USER, SCRAM_PASSWORD)
    produced = 0
    for counts in ({0: 120, 1: 80, 2: 1}, {1: 9}):
        real_counting.produce(topic, counts)
        produced += sum(counts.values())
        settings = secure_settings(real_kafka, real_counting.database_url, topic, options)
        with TransactionalJob(real_counting.spark, settings, count_messages) as job:
            assert job.run_batch().messages == sum(counts.values())
        real_counting.assert_counted_exactly(topic, produced)


@pytest.mark.parametrize(
    ("failure", "what", "check"),
    [
        (
            "wrong password",
            "refused the login (SASL authentication error: Authentication failed during authentication "
            "due to invalid credentials with SASL mechanism SCRAM-SHA-512",
            "check --kafka-option sasl.username, sasl.password and sasl.mechanisms",
        ),
        (
            "untrusted certificate",
            "sent a certificate this client does not trust (SSL handshake failed: "
            "error:0A000086:SSL routines::certificate verify failed",
            "check --kafka-option ssl.ca.location (the CA that signed the broker's certificate)",
        ),
    ],
)
def test_a_wrong_password_or_an_untrusted_certificate_is_one_line_naming_the_broker_and_writes_nothing(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    failure: str,
    what: str,
    check: str,
) -> None:
    """Kafka answers at once, refusing: the job says so at once (not "did not answer within 15s"
    after waiting for an answer that came), naming the broker, what it refused and what to check."""
    topic = real_counting.new_topic(1, prefix="login-refused")
    real_counting.produce(topic, {0: 5})
    if failure == "wrong password":
        options = real_kafka.sasl_ssl_options(SCRAM_USER, "not the password")
    else:
        options = real_kafka.sasl_ssl_options(SCRAM_USER, SCRAM_PASSWORD, trust_ca=False)
    message = refused_at_once(
        real_counting, secure_settings(real_kafka, real_counting.database_url, topic, options)
    )
    assert message.startswith(f"Kafka at {real_kafka.secure_bootstrap_servers} {what}"), message
    assert message.endswith(check), message
    assert SCRAM_PASSWORD not in message and "not the password" not in message


def publish_over_sasl_ssl(
    kafka: RealKafkaCluster, database_url: str, options: dict[str, str], servers: str | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``txstore publish --job j`` through the SASL_SSL listener (or ``servers``) with ``options``;
    what it printed and how long it took."""
    kafka_options = [arg for k, v in options.items() for arg in ("--kafka-option", f"{k}={v}")]
    started = time.monotonic()
    done = txstore(
        "publish",
        "--job",
        "j",
        "--bootstrap-servers",
        servers or kafka.secure_bootstrap_servers,
        *kafka_options,
        url=database_url,
    )
    return done, time.monotonic() - started


@pytest.fixture
def waiting_result(database_url: str, db: psycopg.Connection, new_real_topic: Callable[..., str]) -> str:
    """A results topic on Apache Kafka, with job 'j's one result for it committed, waiting in the outbox."""
    results = new_real_topic(1, prefix="login-results")
    seed(db, "j", "events", {0: 0})
    with connect(database_url) as conn:
        TransactionalSink(conn, "j", publish_to=results).commit(
            OffsetRange("events", 0, 0, 1), {TOPIC_TOTAL: 1}
        )
    return results


def test_txstore_publish_with_the_right_login_sends_the_results_over_sasl_ssl(
    real_kafka: RealKafkaCluster, database_url: str, waiting_result: str
) -> None:
    done, _ = publish_over_sasl_ssl(
        real_kafka, database_url, real_kafka.sasl_ssl_options(SCRAM_USER, SCRAM_PASSWORD)
    )
    assert done.returncode == 0, done.stderr
    assert "published 1 results of job 'j'; 0 waiting, 0 set aside" in done.stdout
    assert len(read_topic(real_kafka, waiting_result)) == 1


def test_txstore_publish_with_a_wrong_password_stops_at_once_with_the_jobs_line_and_keeps_the_results(
    real_kafka: RealKafkaCluster, database_url: str, db: psycopg.Connection, waiting_result: str
) -> None:
    """The publisher checks its login as the job does: Kafka's refusal, in one line, in seconds
    (not "Message timed out" after the 30 s delivery timeout); the result waits, not set aside."""
    done, elapsed = publish_over_sasl_ssl(
        real_kafka, database_url, real_kafka.sasl_ssl_options(SCRAM_USER, "not the password")
    )
    assert done.returncode == 1 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        f"txstore: error: Kafka at {real_kafka.secure_bootstrap_servers} refused the login (SASL authentication "
        "error: Authentication failed during authentication due to invalid credentials with SASL mechanism "
        "SCRAM-SHA-512"
    ), line
    assert line.endswith("check --kafka-option sasl.username, sasl.password and sasl.mechanisms"), line
    assert "not the password" not in line
    assert elapsed < METADATA_TIMEOUT_SECONDS / 2
    assert outbox_counts(db, "j") == (1, 0)
    assert read_topic(real_kafka, waiting_result) == []


# The causes librdkafka reports alike ("certificate verify failed: ... verify that ssl.ca.location
# is correctly configured"), with the right CA configured: each line names its own cause and fix.
FAULTY_CERTIFICATES = [
    pytest.param(
        EXPIRED,
        "sent a certificate that expired on 2025-02-01 00:00:00 UTC (certificate verify failed: "
        "certificate has expired)",
        "have the broker's certificate renewed (the CA in --kafka-option ssl.ca.location is trusted)",
        id="expired",
    ),
    pytest.param(
        OTHER_HOST,
        "sent a certificate for kafka.other.example, 10.255.255.1 but was reached as 127.0.0.1 "
        "(certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'.)",
        "connect by a name the certificate holds (--bootstrap-servers and the broker's advertised.listeners), "
        "or have the broker's certificate issued for 127.0.0.1",
        id="another-host",
    ),
]


@pytest.mark.parametrize(("listener", "what", "check"), FAULTY_CERTIFICATES)
def test_an_expired_certificate_or_one_for_another_host_stops_the_job_at_once_naming_that_cause(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    listener: str,
    what: str,
    check: str,
) -> None:
    """The right CA and password; the broker's certificate is expired, or for another host name:
    the line says which (the dates, the names it holds against the address used), not the CA."""
    topic = real_counting.new_topic(1, prefix="login-refused")
    real_counting.produce(topic, {0: 5})
    servers = real_kafka.faulty_bootstrap_servers(listener)
    options = real_kafka.sasl_ssl_options(SCRAM_USER, SCRAM_PASSWORD)
    message = refused_at_once(
        real_counting, secure_settings(real_kafka, real_counting.database_url, topic, options, servers)
    )
    assert message == f"Kafka at {servers} {what}; {check}"
    assert SCRAM_PASSWORD not in message


@pytest.mark.parametrize(("listener", "what", "check"), FAULTY_CERTIFICATES)
def test_txstore_publish_to_a_broker_with_an_expired_certificate_or_one_for_another_host_names_that_cause(
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    waiting_result: str,
    listener: str,
    what: str,
    check: str,
) -> None:
    servers = real_kafka.faulty_bootstrap_servers(listener)
    options = real_kafka.sasl_ssl_options(SCRAM_USER, SCRAM_PASSWORD)
    done, elapsed = publish_over_sasl_ssl(real_kafka, database_url, options, servers)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"txstore: error: Kafka at {servers} {what}; {check}\n"
    assert elapsed < METADATA_TIMEOUT_SECONDS / 2
    assert outbox_counts(db, "j") == (1, 0)


def test_a_refused_certificate_no_handshake_of_our_own_can_explain_lists_every_possible_cause() -> None:
    """A broker gone before the check connects: the line still names each cause to look at."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        servers = f"127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    message = str(certificate_refusal(servers, {}, "librdkafka's words"))
    assert message == (
        f"Kafka at {servers} sent a certificate this client does not trust (librdkafka's words); check "
        "--kafka-option ssl.ca.location (the CA that signed the broker's certificate), the certificate's dates, "
        "and that it names the host connected to"
    )
    assert time.monotonic() - started < CHECK_TIMEOUT_SECONDS

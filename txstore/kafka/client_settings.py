"""The settings of every Kafka client txstore creates, and the user's settings it refuses.

Pure functions over mappings, no client made: :func:`client_config` (every client's base: timeouts,
the log adapter, the user's ``--kafka-option`` settings after :func:`fixed_option_problem` has
refused those exact reads rely on, a consumer group's, and the Java client's that librdkafka does
not take), :func:`reader_config` (a range reader's, read-committed, with its fixed settings), and
:func:`topic_name_problem` (Kafka's topic-name rule). The clients themselves are
:mod:`txstore.kafka.admin` (admin calls; log offsets: :mod:`txstore.kafka.client`) and
:mod:`txstore.kafka.reader`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from txstore.core.env import BOOTSTRAP_ENV
from txstore.core.errors import ConfigError

CLIENT_LOG = logging.getLogger("txstore.kafka.client")
"""Where librdkafka's own log lines go, from every client txstore creates, at DEBUG (shown with
a job's ``--verbose``)."""


class ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """What a client's ``logger`` setting gets: librdkafka's lines on :data:`CLIENT_LOG`, at DEBUG.

    librdkafka repeats a failing connection many times a second (``FAIL ... Connection
    refused``, as ERROR); the one-line error that ends a call already says what the broker
    said, so its own lines are kept out of the way: never on stderr (Python's last-resort
    handler prints a WARNING or above when nothing configured logging, as in the ``txstore``
    command or a Spark worker), and shown only where DEBUG is. The level librdkafka gave is
    kept in the line. Pickles by name, so a client setting built on the driver still works
    in a Spark task; its ``repr`` is fixed, since consumer and producer pools key on it.
    """

    def __init__(self) -> None:
        super().__init__(CLIENT_LOG, {})

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(f"[{logging.getLevelName(level)}] {msg}", *args, **kwargs)

    def __repr__(self) -> str:
        return f"<ClientLog {CLIENT_LOG.name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientLog)

    def __hash__(self) -> int:
        return hash(ClientLog)


CLIENT_LOGGER = ClientLog()
"""The ``logger`` setting of every Kafka client (:func:`client_config` puts it in)."""


# Settings a user's --kafka-option must not change: they are what makes reads exact.
_READER_FIXED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
}
_FIXED_OPTIONS = {
    "isolation.level": "read_committed",
    **{k: str(v).lower() for k, v in _READER_FIXED.items()},
    "auto.commit.enable": "false",  # librdkafka's old name for enable.auto.commit
}


_CONSUMER_GROUP = ("group.id", "group.instance.id")
"""Settings naming a consumer group: a job's readers use none (``--commit-to-kafka-group`` mirrors)."""

_PEM_TRUST = (("ssl.ca.location",), "the CA certificates as a PEM file")
_PEM_KEY = (
    ("ssl.certificate.location", "ssl.key.location"),
    "PEM files; or a PKCS#12 .p12 file as ssl.keystore.location",
)
_JAVA_ONLY: dict[str, tuple[tuple[str, ...], str]] = {
    "ssl.truststore.location": _PEM_TRUST,
    "ssl.truststore.password": _PEM_TRUST,
    "ssl.truststore.type": _PEM_TRUST,
    "ssl.keystore.type": _PEM_KEY,
    "sasl.jaas.config": (("sasl.username", "sasl.password"), "with sasl.mechanism"),
}


def java_only_setting(options: Mapping[str, str]) -> tuple[str, tuple[str, ...], str] | None:
    """The first of ``options`` (librdkafka settings, no prefix) that only Kafka's Java client
    takes: its name as given, the librdkafka settings to give instead, and a note on them;
    None if there is none.

    Code moved from Spark's ``format("kafka")`` brings the Java client's JKS trust and key
    stores and its JAAS line. librdkafka has no trust store, reads only PKCS#12 key stores and
    takes no JAAS, and would refuse them only when its first client is made, deep in a task.
    """
    for key, value in sorted(options.items()):
        setting = key.strip().lower()
        if setting in _JAVA_ONLY:
            return (key, *_JAVA_ONLY[setting])
        if setting == "ssl.keystore.location" and value.strip().lower().endswith(".jks"):
            return (key, *_PEM_KEY)
    return None


def java_only_problem(options: Mapping[str, str], prefix: str) -> str | None:
    """:func:`java_only_setting` as one line, each setting named after ``prefix``
    (``--kafka-option `` or ``option kafka.``); never a value (it may be a password)."""
    found = java_only_setting(options)
    if found is None:
        return None
    key, instead, note = found
    jks = " (a .jks file)" if key.strip().lower() == "ssl.keystore.location" else ""
    return (
        f"{prefix}{key}{jks} is a setting of Kafka's Java client that librdkafka, txstore's Kafka "
        f"client, does not take; give {' and '.join(prefix + name for name in instead)} instead ({note})"
    )


def fixed_option_problem(options: Mapping[str, str]) -> str | None:
    """Why one of ``options`` (``--kafka-option``) may not be given, or None.

    ``isolation.level`` and the reader's fixed settings are what make a
    range read exactly what the planner saw (committed messages up to the
    last stable offset, no offsets stored or jumped); changing one would
    silently change what is counted, so it is refused, not ignored. A setting only Kafka's
    Java client takes (:func:`java_only_setting`) is refused too, naming the librdkafka ones.
    """
    for key, value in options.items():
        if key.strip().lower() in _CONSUMER_GROUP:
            return (
                f"--kafka-option {key} is refused: txstore's readers join and commit to no Kafka "
                "consumer group (a job's offsets are in PostgreSQL, txn_offsets); to mirror them to a "
                "group for Kafka's tooling, give --commit-to-kafka-group GROUP instead"
            )
        fixed = _FIXED_OPTIONS.get(key.strip().lower())
        if fixed is not None:
            return (
                f"--kafka-option {key}={value} is refused: txstore sets {key.strip().lower()}={fixed} "
                "itself, which exact counts rely on; remove the option"
            )
    return java_only_problem(options, "--kafka-option ")


_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def topic_name_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be a Kafka topic name, or None if it can.

    Kafka allows 1 to 249 ASCII letters, digits, ``.``, ``_`` and ``-``, and
    not ``.`` or ``..``; anything else is refused before any client is made.
    """
    if topic in (".", ".."):
        return f"{topic!r} is not allowed as a Kafka topic name"
    if not _TOPIC_NAME.match(topic):
        return f"{topic!r} is not a valid Kafka topic name: use 1 to 249 letters, digits, '.', '_' and '-'"
    return None


RECONNECT_BACKOFF_MS = 20
"""Every client's ``reconnect.backoff.ms`` (librdkafka's is 100; Kafka's Java client's, 50).

librdkafka drops its connection to a bootstrap address once the first metadata names the
brokers, failing the request in flight on it, and connects to a named broker only after its
sparse-connect interval: half of this, at least 11 ms. With librdkafka's 100 ms every new admin
client's first answer took about 54 ms on Apache Kafka; with 20, about 15 ms
(``tests/kafka/test_client_start.py``). A connection that fails is still tried again with a
backoff that doubles up to ``reconnect.backoff.max.ms`` (10 s), from 20 ms."""


def client_config(bootstrap_servers: str, options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Base settings shared by every Kafka client txstore creates (TLS/SASL go in ``options``,
    which may change these: :data:`RECONNECT_BACKOFF_MS` too)."""
    if not bootstrap_servers:
        raise ConfigError(f"no Kafka given: pass --bootstrap-servers or set {BOOTSTRAP_ENV}")
    problem = fixed_option_problem(options or {})
    if problem:
        raise ConfigError(problem)
    conf: dict[str, Any] = {
        "socket.timeout.ms": 10_000,
        "socket.connection.setup.timeout.ms": 10_000,
        "log_level": 3,
        "reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
    }
    conf.update(options or {})
    conf["logger"] = CLIENT_LOGGER
    conf["bootstrap.servers"] = bootstrap_servers
    return conf


def reader_config(base: Mapping[str, Any]) -> dict[str, Any]:
    conf = {
        "group.id": "txstore-reader",  # required by librdkafka; never joined or committed to
        "isolation.level": "read_committed",
        # A range is read once it is known to exist, so a fetch never needs to wait
        # for data. When a range ends at the log end, the consumer's next fetch is
        # held by the broker this long, and on a reused consumer the next range's
        # first fetch queues behind it: keep it short.
        "fetch.wait.max.ms": 1,
        # Prefetch a couple of fetches ahead, not librdkafka's 100,000 messages /
        # 64 MiB: a reader's memory stays small and independent of the range size.
        # With a small queue, fetch again as soon as it drains (librdkafka's
        # default waits a whole second once the queue was full).
        "queued.min.messages": 20_000,
        "queued.max.messages.kbytes": 16_384,
        "fetch.queue.backoff.ms": 1,
        **base,
        **_READER_FIXED,
    }
    return conf


def servers_of(conf: Mapping[str, Any]) -> str:
    """The Kafka addresses ``conf`` names, for a one-line error."""
    return str(conf.get("bootstrap.servers"))

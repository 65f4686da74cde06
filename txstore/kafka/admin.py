"""The admin client txstore asks Kafka through, and how a broker's refusal becomes one line.

Every call has a timeout; a client's errors are kept, not printed (:class:`Admin`).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from txstore.core.env import BOOTSTRAP_ENV
from txstore.core.errors import ConfigError, KafkaUnavailable
from txstore.kafka.certificates import certificate_refusal
from txstore.kafka.client_settings import CLIENT_LOGGER
from txstore.kafka.log_offsets import LeadershipUnsettled

METADATA_TIMEOUT_SECONDS = 15.0
"""How long a metadata request or a one-off ListOffsets lookup may take by default."""


class Admin:
    """An AdminClient for one driver-side call (or one command's several), which keeps the errors
    librdkafka reports.

    librdkafka retries a broker it cannot reach or talk to (refused, TLS or SASL
    handshake failed) until the call times out, and would print a line to stderr
    for every attempt. Here its log lines go to :data:`~txstore.kafka.client_settings.CLIENT_LOG` (at DEBUG) and its errors
    are kept, so a failed call becomes one line that says what the broker said.
    Metadata requests never create topics, whatever the broker allows.

    A command asking topic by topic keeps one for all its calls (their ``admin``): a new
    librdkafka client waits for its first answer (on one machine with Apache Kafka, about 15 ms
    with :data:`~txstore.kafka.client_settings.RECONNECT_BACKOFF_MS`, about 55 ms before; a kept
    one about 2 ms), so ``txstore status`` with a client per topic took 1.4 s for a job of 20 topics.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self.errors: list[KafkaError] = []
        self.settings = settings = {
            **conf,
            "allow.auto.create.topics": False,
            "error_cb": self.errors.append,
            "logger": CLIENT_LOGGER,
        }
        try:
            self.client = AdminClient(settings)
        except (KafkaException, ValueError, TypeError) as e:
            raise ConfigError(
                f"Kafka client settings refused: {error_text(e)}; check --kafka-option"
            ) from None

    def last_error(self) -> str | None:
        """The last error librdkafka reported (not "all brokers down"), after serving its queue."""
        try:
            self.client.poll(0)
        except Exception:  # serving callbacks must never hide the original failure
            return None
        for error in reversed(self.errors):
            if error.code() != KafkaError._ALL_BROKERS_DOWN:
                return str(error.str())
        return None

    def refusal(self, servers: str) -> KafkaUnavailable | None:
        """The broker answered and refused this client for good (after serving its queue):
        :func:`refusal`. Waiting longer cannot help, so the call stops at once, saying which."""
        try:
            self.client.poll(0)
        except Exception:
            return None
        return refusal(self.errors, servers, self.settings)

    def metadata(self, servers: str, topic: str | None, timeout: float) -> Any:
        """``list_topics(topic)`` within ``timeout``. While librdkafka reports errors it is asked
        in slices of a second, so that a refusal (:meth:`refusal`) ends the call at once rather
        than when the timeout is spent; a broker that is only slow (no error) gets the rest of
        the timeout in one request."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.client.list_topics(topic, timeout=max(min(1.0, left), 0.001))
            except KafkaException:
                refused = self.refusal(servers)
                if refused is not None:
                    raise refused from None
                if time.monotonic() + 0.001 >= deadline:
                    raise
                if not self.errors:  # slow, not failing: one request for the rest of the time
                    return self.client.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.001))

    def unavailable(self, servers: str, what: str, timeout: float, error: BaseException) -> KafkaUnavailable:
        refused = self.refusal(servers)
        if refused is not None:
            return refused
        if isinstance(error, LeadershipUnsettled):
            return KafkaUnavailable(
                f"Kafka at {servers} answered {what}, but the leadership of {error.where} was still "
                f"moving after {timeout:g}s ({error.error.str()}): a topic just created or a broker "
                "restarting settles in seconds; run again, and if it persists check the topic's "
                "leaders (kafka-topics.sh --describe)"
            )
        reason = self.last_error() or error_text(error)
        return KafkaUnavailable(
            f"Kafka at {servers} did not answer {what} within {timeout:g}s ({reason}); check "
            f"--bootstrap-servers / {BOOTSTRAP_ENV}, the network, and --kafka-option security settings"
        )


def refusal(errors: Sequence[KafkaError], servers: str, conf: Mapping[str, Any]) -> KafkaUnavailable | None:
    """Whether ``errors`` (what a client's ``error_cb`` was given) say the broker at ``servers``
    answered and refused the client for good: a login it does not accept, or a certificate the
    client does not trust (what was wrong with it is found with the client's settings ``conf``:
    :func:`~txstore.kafka.certificates.certificate_refusal`). Every client txstore makes stops at
    once on these, in the same line: planning (:class:`Admin`) and publishing
    (:mod:`txstore.postgres.outbox`)."""
    for error in errors:
        reason = _CLIENT_PREFIX.sub("", str(error.str()))
        if error.code() == KafkaError._AUTHENTICATION:
            return KafkaUnavailable(
                f"Kafka at {servers} refused the login ({reason}); check --kafka-option "
                "sasl.username, sasl.password and sasl.mechanisms"
            )
        if error.code() == KafkaError._SSL and "certificate verify failed" in reason:
            return certificate_refusal(servers, conf, reason)
    return None


# How librdkafka begins a broker's error: "sasl_ssl://127.0.0.1:9093/bootstrap: " (the broker is named).
_CLIENT_PREFIX = re.compile(r"^[a-z_]+://[^ ]+/[^ :]+: ")


def error_text(error: BaseException) -> str:
    """A Kafka exception's own message: librdkafka's error text, not its tuple."""
    first = error.args[0] if error.args else error
    return str(first.str()) if isinstance(first, KafkaError) else str(first)


def one_client(conf: Mapping[str, Any]) -> Callable[[], Admin]:
    """One admin client for ``conf``, made at the first call and the same one at every call after:
    what a command or a plan that asks Kafka several things passes around (a new client waits
    for its first answer: :class:`Admin`), never made if nothing is asked."""
    return functools.cache(lambda: Admin(conf))


def kept(admin: Admin | None, conf: Mapping[str, Any]) -> Admin:
    """``admin`` with its errors cleared (only this call's explain its failure), else a new client."""
    if admin is None:
        return Admin(conf)
    admin.errors.clear()
    return admin

"""Named errors, one per broken invariant.

Every message is one line for a human at 3 a.m.: what is wrong, which
job/topic/partition/offsets are involved, and what to do next. No message
ever contains a database password (URLs are redacted before they get here).
"""

from __future__ import annotations

from typing import Protocol


class OffsetRange(Protocol):
    """What an error names of a range: :class:`txstore.core.ranges.OffsetRange` (not imported, so that
    the ranges, which raise these errors, and the errors import nothing of each other)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def from_offset(self) -> int: ...

    @property
    def until_offset(self) -> int: ...


def first_line(error: BaseException) -> str:
    """The first line of an error's text (its type name if it has none), for one-line reports."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class TxstoreError(Exception):
    """Base class: ``str(error)`` is the one-line reason the CLI prints.

    ``transient`` errors may go away by themselves (a server restarting); a
    continuous job retries its batch after them. Everything else needs a human.
    """

    transient = False


class ConfigError(TxstoreError):
    """A flag, environment variable or argument is missing or malformed."""


class MetricsPortInUse(ConfigError):
    """``--metrics-port`` cannot be opened (in use, or not ours to bind); the job exits 2."""


class DatabaseUnavailable(TxstoreError):
    """PostgreSQL could not be reached, refused the login, or dropped the connection."""

    transient = True


class ResultsTableInvalid(ConfigError):
    """The results table, its key or merge rules do not fit the table or the query; the job exits 2.

    ``problems``: one line each, naming the column; ``str()`` is them all, one per line.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(problems))


class PermissionDenied(TxstoreError):
    """The database role lacks a privilege the job needs (see the README's job role)."""


PRIVILEGE_HINT = (
    "a job's role needs SELECT on alembic_version and SELECT, INSERT, UPDATE on txn_offsets, "
    "txn_data, txn_lost_ranges and txn_subscriptions (README: a role for jobs)"
)

STREAM_PRIVILEGE_HINT = (
    "a streaming job's role needs SELECT on alembic_version, SELECT, INSERT, UPDATE on txn_offsets, "
    "txn_data, txn_lost_ranges, txn_subscriptions and txn_stream_plans, and SELECT, INSERT, UPDATE, DELETE on "
    "txn_stream_reads (README: a role for jobs)"
)


class SchemaMissing(TxstoreError):
    """The txstore tables are missing or older than this code."""


class SparkStartFailed(TxstoreError):
    """Spark did not start: a master or Spark Connect server that cannot be reached, or no answer
    from the Connect server within the job's ``--connect-timeout``; the line names the cause."""


class SparkStartAbandoned(TxstoreError):
    """A stop (SIGTERM or Ctrl-C) came while the job waited for a Spark Connect server: no batch
    ran, nothing was committed; the job ends as after its last batch (exit 0)."""


class KafkaUnavailable(TxstoreError):
    """Kafka metadata or watermarks could not be fetched in time."""

    transient = True


class UnknownTopic(KafkaUnavailable):
    """A topic the job was told to read does not exist (txstore never creates topics).

    ``topic`` and ``servers`` name it and the Kafka asked, so that a caller who knows more can
    say more: a job with offsets stored for the topic counted it, so it is not a typo but a
    topic deleted, perhaps being recreated (:func:`txstore.core.ranges.topic_missing_now`)."""

    transient = False

    def __init__(self, message: str, topic: str = "", servers: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.servers = servers


class KafkaReadError(TxstoreError):
    """Reading an offset range from Kafka failed."""

    transient = True


class DataLoss(KafkaReadError):
    """Offsets the job still has to count are no longer in Kafka (retention)."""

    transient = False


class OffsetOutOfLog(TxstoreError):
    """A stored offset lies beyond a partition's log end, or the partition is gone."""


class TopicRecreated(TxstoreError):
    """The partition's log is not the one the job counted: the message last counted is
    another message now, or the topic ID changed (the topic was deleted and recreated)."""


class CommitConflict(TxstoreError):
    """The conditional offset update matched no row: the range was not committed.

    The transaction was rolled back, so results and offsets are exactly as
    they were. Subclasses say why, from the offset found in the database.
    """

    def __init__(self, job: str, offset_range: OffsetRange, stored_offset: int | None) -> None:
        self.job = job
        self.offset_range = offset_range
        self.stored_offset = stored_offset
        super().__init__(self._describe())

    def _describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def _where(self) -> str:
        r = self.offset_range
        return (
            f"job {self.job!r} topic {r.topic!r} partition {r.partition} "
            f"range {r.from_offset} -> {r.until_offset}"
        )


class AlreadyCommitted(CommitConflict):
    """The stored offset already equals ``until``: a retried or speculative task,
    or a commit whose acknowledgement was lost. Not a failure: nothing changes."""

    def _describe(self) -> str:
        return f"{self._where}: already committed (stored offset {self.stored_offset}); skipped"


class OffsetGap(CommitConflict):
    """The stored offset is below ``from``: committing would skip messages."""

    def _describe(self) -> str:
        return (
            f"{self._where}: gap, stored offset {self.stored_offset} is below "
            f"{self.offset_range.from_offset}; "
            "messages in between would be lost, so nothing was written. "
            "Was the offset reset while the job ran? Rerun the job to plan from the stored offset."
        )


class OffsetOverlap(CommitConflict):
    """Anything else: the range overlaps what is committed, or the row is missing."""

    def _describe(self) -> str:
        found = "no offset row" if self.stored_offset is None else f"stored offset {self.stored_offset}"
        return (
            f"{self._where}: overlap, {found} does not match the range start; "
            "committing would count messages twice, so nothing was written. "
            "Is another instance of this job running? Rerun it to plan from the stored offset."
        )


class BatchFailed(TxstoreError):
    """A batch did not commit all its ranges (those that committed stay committed).

    ``replan``: the refusal only means the plan is stale (another writer, or a
    late task of an earlier failed batch, committed part of a range after it
    was planned); planning again from the stored offsets is safe at once.
    ``conflict``: the :class:`CommitConflict` class name when a driver-side
    (per-batch) commit was refused for a gap or overlap (for the metrics).
    """

    def __init__(
        self, message: str, *, transient: bool, replan: bool = False, conflict: str | None = None
    ) -> None:
        super().__init__(message)
        self.transient = transient or replan
        self.replan = replan
        self.conflict = conflict


def committed_past_start(error: CommitConflict) -> bool:
    """An overlap because someone committed beyond the range's start after it was planned."""
    stored = error.stored_offset
    return isinstance(error, OffsetOverlap) and stored is not None and stored > error.offset_range.from_offset


class PublishFailed(TxstoreError):
    """Committed results could not be published to Kafka; they stay in ``txn_outbox`` for the next try."""

    transient = True


class BadMessage(TxstoreError):
    """The aggregate (or the idempotent sink's transform) fails on one message, every time.

    Found by re-running the aggregate over smaller and smaller pieces of the
    range (:mod:`txstore.kafka.bad_messages`), so it names the very message. Retrying
    cannot help: nothing was committed for the range, and the job stops until
    the message is dealt with or ``--on-bad-message skip`` is given.
    """

    def __init__(self, job: str, topic: str, partition: int, offset: int, reason: str, stage: str) -> None:
        self.job = job
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        self.stage = stage  # "aggregate" or "transform"
        super().__init__(
            f"job {job!r} topic {topic!r} partition {partition} offset {offset}: the {stage} failed on "
            f"this message ({reason}); nothing was committed for its range, and retrying cannot help. "
            "To skip such messages and record them in txn_bad_messages, rerun with --on-bad-message skip"
        )

    def __reduce__(self) -> tuple[type[BadMessage], tuple[str, str, int, int, str, str]]:
        return (BadMessage, (self.job, self.topic, self.partition, self.offset, self.reason, self.stage))


class TooManyBadMessages(TxstoreError):
    """More messages of one batch fail than a search for bad messages takes
    (:data:`txstore.spark.ranges.bad_rows.MAX_BAD_MESSAGES`): nothing was committed, nothing recorded."""

    def __init__(self, job: str, limit: int, first: str) -> None:
        self.job = job
        self.limit = limit
        self.first = first
        super().__init__(
            f"job {job!r}: more than {limit} messages of this batch fail (the first: {first}); so many "
            "are rarely the messages' fault: check the query and the table (its types and constraints); "
            "nothing was committed and none were recorded"
        )

    def __reduce__(self) -> tuple[type[TooManyBadMessages], tuple[str, int, str]]:
        return (TooManyBadMessages, (self.job, self.limit, self.first))

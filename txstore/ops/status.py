"""What ``txstore status``, ``status --check`` and ``jobs`` show: the database, and Kafka where it answers.

Each partition a job stores an offset for (or that Kafka has in one of its topics) is one
:class:`PartitionStatus`; :func:`~txstore.ops.health_facts.health_facts` gathers what
:mod:`txstore.core.health` judges. Kafka is asked with a short timeout (:data:`STATUS_KAFKA_TIMEOUT_SECONDS`): a broker
that does not answer leaves the Kafka columns empty, never the command hanging.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg

from txstore.core.errors import KafkaUnavailable, UnknownTopic
from txstore.core.ranges import PartitionWatermarks
from txstore.core.results import plain_number
from txstore.core.subscription import Subscription
from txstore.kafka.admin import Admin, one_client
from txstore.kafka.client import fetch_topic_names, fetch_watermarks
from txstore.postgres import store
from txstore.postgres.locks import job_running

STATUS_KAFKA_TIMEOUT_SECONDS = 5.0
NEVER = "never"
"""What ``status`` and ``jobs`` show as the last commit of a partition (or job) that never committed;
``--json`` has null."""

COMMITTED = "(cardinality(o.lag_samples) > 0 OR o.last_off IS NOT NULL)"
"""SQL: the row ``o`` of ``txn_offsets`` was moved by a commit, not only created (by a job's start,
or a reset). Each commit records the backlog its range started from, or the last message it
counted; a start row has neither, nor has a row a reset moved into a new generation (its
generation never committed). ``updated_at`` alone cannot tell: a start row has it too."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class PartitionStatus:
    """One partition of a job. ``offset``, ``generation`` and ``last_commit`` None: a partition
    Kafka has in one of the job's topics that the job has not started yet (no row; its lag is
    counted from the log start, where the job will start it). ``last_commit`` None with an offset:
    the job started the partition but never committed it (:data:`COMMITTED`)."""

    job: str
    topic: str
    partition: int
    offset: int | None
    generation: int | None
    log_start: int | None
    log_end: int | None
    lag: int | None
    last_commit: datetime | None
    running: bool
    # The job's results in txn_outbox (--publish-topic): waiting to be sent, and set aside
    # because Kafka refused them for good (`txstore publish --job J --retry-failed`).
    outbox_pending: int = 0
    outbox_set_aside: int = 0
    skipped: int = 0  # messages skipped as bad (--on-bad-message skip), in txn_bad_messages


@dataclass(frozen=True)
class OutboxStatus:
    """A job's unsent outbox rows: pending, and set aside (refused by Kafka for good)."""

    job: str
    pending: int
    set_aside: int

    def warning(self) -> str:
        return (
            f"job {self.job!r}: {self.set_aside} results set aside in txn_outbox because Kafka "
            "refused them for good (see failed_reason); fix the cause, then run "
            f"`txstore publish --job {self.job} --retry-failed`"
        )


@dataclass(frozen=True)
class JobSummary:
    job: str
    topic: str
    partitions: int
    # The topic-total metric (a message count for count_topic); for a job with no
    # topic total, such as an idempotent-sink job, the messages it has stored.
    total: int | float
    last_commit: datetime | None  # None: no partition of the topic committed yet
    running: bool
    skipped: int = 0  # messages skipped as bad (--on-bad-message skip), in txn_bad_messages


def _distinct_jobs(table: str, where: str = "TRUE") -> str:
    """The distinct jobs of ``table`` by a skip scan of its index on ``job`` (one index probe per
    job, not a scan of every row: ``txn_data`` and ``txn_messages`` can hold millions)."""
    return (
        f"(WITH RECURSIVE j(job) AS (SELECT min(job) FROM {table} WHERE {where} "
        f"UNION ALL SELECT (SELECT min(job) FROM {table} WHERE {where} AND job > j.job) FROM j "
        "WHERE j.job IS NOT NULL) SELECT job FROM j WHERE job IS NOT NULL)"
    )


_KNOWN_JOBS = (
    " UNION ".join(
        [
            _distinct_jobs("txn_offsets"),
            _distinct_jobs("txn_data"),
            _distinct_jobs("txn_messages"),
            # Unsent results, in the outbox's two partial indexes: waiting, and set aside.
            _distinct_jobs("txn_outbox", "sent_at IS NULL AND failed_at IS NULL"),
            _distinct_jobs("txn_outbox", "sent_at IS NULL AND failed_at IS NOT NULL"),
            _distinct_jobs("txn_bad_messages"),
        ]
    )
    + " ORDER BY 1"
)


_JOB_KNOWN = (
    "SELECT EXISTS (SELECT FROM txn_offsets WHERE job = %(job)s) "
    "OR EXISTS (SELECT FROM txn_data WHERE job = %(job)s) "
    "OR EXISTS (SELECT FROM txn_messages WHERE job = %(job)s) "
    "OR EXISTS (SELECT FROM txn_outbox WHERE job = %(job)s AND sent_at IS NULL AND failed_at IS NULL) "
    "OR EXISTS (SELECT FROM txn_outbox WHERE job = %(job)s AND sent_at IS NULL AND failed_at IS NOT NULL) "
    "OR EXISTS (SELECT FROM txn_bad_messages WHERE job = %(job)s)"
)


def known_jobs(conn: psycopg.Connection) -> list[str]:
    """The jobs the database knows, by anything stored for them (as :func:`unknown_job_problem`):
    offsets, results, messages, results to publish (waiting or set aside), messages skipped as
    bad; each by a skip scan of an index on ``job``."""
    rows = conn.execute(_KNOWN_JOBS).fetchall()
    conn.commit()
    return [r[0] for r in rows]


def unknown_job_problem(conn: psycopg.Connection, job: str) -> str | None:
    """Why ``job`` (``--job``) names no job the database knows, listing those it does; None if known.

    A job is known by anything stored for it: offsets, results, messages (a ``--forget`` leaves
    those), results to publish (waiting or set aside), messages skipped as bad; each looked up by
    an index on ``job``.
    A typo would otherwise show an empty status, or have ``txstore reset`` store offsets for a
    job that never existed."""
    row = conn.execute(_JOB_KNOWN, {"job": job}).fetchone()
    conn.commit()
    if row and row[0]:
        return None
    known = known_jobs(conn)
    listed = f"known jobs: {', '.join(map(repr, known))}" if known else "no jobs yet"
    return f"no job {job!r} in the database ({listed})"


def status(
    conn: psycopg.Connection, kafka_conf: Mapping[str, Any] | None, job: str | None = None
) -> tuple[list[PartitionStatus], str | None]:
    """Every stored partition (of ``job``, or of all jobs) with Kafka's view of it, and every
    partition Kafka has in a job's topics that the job has not started yet.

    Without Kafka (no settings, or no answer in time) the Kafka columns are
    None and the second value says why; the database part is still shown.
    """
    rows = conn.execute(
        f"SELECT o.job, o.topic, o.part, o.off, o.generation, CASE WHEN {COMMITTED} THEN o.updated_at END, "
        "  (SELECT count(*) "
        "    FROM txn_bad_messages b WHERE b.job = o.job AND b.topic = o.topic AND b.part = o.part) "
        "FROM txn_offsets o WHERE %(job)s::text IS NULL OR o.job = %(job)s ORDER BY o.job, o.topic, o.part",
        {"job": job},
    ).fetchall()
    conn.commit()
    subs = store.subscriptions(conn, job)
    kafka = ask_kafka(kafka_conf, subs, {r[1] for r in rows})
    matched, marks = kafka.matched, kafka.marks
    if not kafka_conf:
        problem: str | None = "Kafka not given (--bootstrap-servers): log offsets and lag unknown"
    elif kafka.unavailable:
        problem = f"{kafka.unavailable} (log offsets and lag unknown)"
    else:
        problem = gone_topics_problem(kafka.gone)
    answered = bool(kafka_conf) and kafka.unavailable is None
    running = {j: job_running(conn, j) for j in sorted({r[0] for r in rows} | set(matched))}
    outbox = {o.job: o for o in outbox_status(conn, job)}
    result = []
    for j, topic, part, off, generation, updated, skipped in rows:
        w = marks.get((topic, part))
        result.append(
            PartitionStatus(
                j,
                topic,
                part,
                off,
                generation,
                w.low if w else None,
                w.high if w else None,
                (w.high - off) if w else None,
                updated,
                running[j],
                outbox[j].pending if j in outbox else 0,
                outbox[j].set_aside if j in outbox else 0,
                skipped,
            )
        )
    new = not_started([(r[0], r[1], r[2]) for r in rows], marks, subs, matched) if answered else []
    if new:
        bad = {
            (j, t, p): n
            for j, t, p, n in conn.execute(
                "SELECT job, topic, part, count(*) FROM txn_bad_messages "
                "WHERE %(job)s::text IS NULL OR job = %(job)s GROUP BY job, topic, part",
                {"job": job},
            ).fetchall()
        }
        conn.commit()
        for j, w in new:
            result.append(
                PartitionStatus(
                    j,
                    w.topic,
                    w.partition,
                    None,
                    None,
                    w.low,
                    w.high,
                    w.high - w.low,
                    None,
                    running[j],
                    outbox[j].pending if j in outbox else 0,
                    outbox[j].set_aside if j in outbox else 0,
                    bad.get((j, w.topic, w.partition), 0),
                )
            )
        result.sort(key=lambda r: (r.job, r.topic, r.partition))
    return result, problem


def gone_topics_problem(gone: Sequence[str]) -> str | None:
    """The warning for topics a job stored offsets for that Kafka does not have, or None."""
    if not gone:
        return None
    named = ", ".join(map(repr, gone))
    them = "its" if len(gone) == 1 else "their"
    return (
        f"topic{'s' if len(gone) > 1 else ''} {named} not in Kafka (deleted, or not created yet): "
        f"{them} log offsets and lag unknown; txstore status --check judges {'it' if len(gone) == 1 else 'them'}"
    )


def not_started(
    stored: Iterable[tuple[str, str, int]],
    marks: Mapping[tuple[str, int], PartitionWatermarks],
    subs: Mapping[str, Subscription] | None = None,
    matched: Mapping[str, Sequence[str]] | None = None,
) -> list[tuple[str, PartitionWatermarks]]:
    """``(job, Kafka's partition)`` for each partition Kafka has (``marks``) that is a job's and
    that the job has no row for (``stored``: job, topic, partition): a partition of a topic the
    job stores offsets for, or of a topic its pattern matches now (``matched``: job -> topics).

    A job with a recorded subscription (``subs``, :mod:`txstore.core.subscription`) owns only the
    partitions it holds: a partition left out of its assignment is another job's, not one this
    job has yet to start. A job without one owns every partition of its stored topics."""
    have = set(stored)
    subs = subs or {}
    topics = {(j, t) for j, t, _ in have} | {(j, t) for j, ts in (matched or {}).items() for t in ts}
    return sorted(
        (
            (j, w)
            for j, t in topics
            for w in marks.values()
            if w.topic == t
            and (j, t, w.partition) not in have
            and (j not in subs or subs[j].holds(t, w.partition))
        ),
        key=lambda found: (found[0], found[1].topic, found[1].partition),
    )


@dataclass(frozen=True)
class KafkaView:
    """What Kafka says of a command's jobs' topics, asked on one admin client (a new client waits
    for its first answer, :class:`~txstore.kafka.admin.Admin`: a client per topic made ``status``
    of 50 topics 2.5 s)."""

    matched: dict[str, list[str]]
    """Per job subscribed by pattern, the topics its pattern matches now."""
    marks: dict[tuple[str, int], PartitionWatermarks]
    """Every partition of the topics Kafka answered for, by (topic, partition)."""
    answered: list[str]
    """The topics Kafka gave watermarks of."""
    gone: list[str]
    """The topics Kafka does not have (deleted, or not created yet): only their partitions are unknown."""
    unavailable: str | None
    """Why Kafka's answer is incomplete (not answering in time, the topic list refused); None: complete."""


def ask_kafka(
    conf: Mapping[str, Any] | None,
    subs: Mapping[str, Subscription],
    stored: Iterable[str],
    admin: Callable[[], Admin] | None = None,
) -> KafkaView:
    """Kafka's watermarks of the ``stored`` topics and of every topic a pattern job matches now,
    topic by topic on one client, so that one topic Kafka does not have leaves only its own
    partitions unknown; the first topic Kafka does not answer for stops the asking. Nothing is
    asked without Kafka settings (``conf`` None). ``admin``: the command's client, made when
    first called (else one of the call's own), for a command that asks Kafka more after."""
    if not conf:
        return KafkaView({}, {}, [], [], None)
    client = admin if admin is not None else one_client(conf)
    matched, unlisted = _pattern_matches(conf, subs, client)
    if unlisted:
        return KafkaView(matched, {}, [], [], unlisted)
    marks: dict[tuple[str, int], PartitionWatermarks] = {}
    answered: list[str] = []
    gone: list[str] = []
    for topic in sorted({*stored, *(t for ts in matched.values() for t in ts)}):
        try:
            marks.update(
                (w.key, w) for w in fetch_watermarks(conf, [topic], STATUS_KAFKA_TIMEOUT_SECONDS, client())
            )
        except UnknownTopic:
            gone.append(topic)
        except KafkaUnavailable as e:
            return KafkaView(matched, marks, answered, gone, str(e))
        else:
            answered.append(topic)
    return KafkaView(matched, marks, answered, gone, None)


def _pattern_matches(
    conf: Mapping[str, Any], subs: Mapping[str, Subscription], admin: Callable[[], Admin]
) -> tuple[dict[str, list[str]], str | None]:
    """Per pattern job, the topics on Kafka its pattern matches now (one metadata request, only
    when a job subscribes by pattern), and why there are none if Kafka did not answer.
    ``admin``: the command's client (as :func:`ask_kafka` makes it)."""
    patterns = {j: sub for j, sub in subs.items() if sub.kind == "pattern"}
    if not patterns:
        return {}, None
    try:
        names = fetch_topic_names(conf, STATUS_KAFKA_TIMEOUT_SECONDS, admin())
    except KafkaUnavailable as e:
        return {}, str(e)
    return {j: [t for t in names if sub.holds(t, 0)] for j, sub in sorted(patterns.items())}, None


_OUTBOX_STATUS = (
    # Two parts, each the predicate of a partial index (txn_outbox_pending_idx and
    # txn_outbox_set_aside_idx): `sent_at IS NULL` alone matches neither, and read the whole
    # table, every result sent in the last 7 days included.
    "SELECT job, sum(pending)::bigint, sum(set_aside)::bigint FROM ("
    "  SELECT job, count(*) AS pending, 0 AS set_aside FROM txn_outbox"
    "  WHERE sent_at IS NULL AND failed_at IS NULL AND (%(job)s::text IS NULL OR job = %(job)s)"
    "  GROUP BY job"
    "  UNION ALL"
    "  SELECT job, 0, count(*) FROM txn_outbox"
    "  WHERE sent_at IS NULL AND failed_at IS NOT NULL AND (%(job)s::text IS NULL OR job = %(job)s)"
    "  GROUP BY job"
    ") unsent GROUP BY job ORDER BY job"
)


def outbox_status(conn: psycopg.Connection, job: str | None = None) -> list[OutboxStatus]:
    """Per job (or only ``job``) with unsent outbox rows: how many are pending and set aside.

    Reads only unsent rows, through the outbox's two partial indexes (:data:`_OUTBOX_STATUS`).
    """
    rows = conn.execute(_OUTBOX_STATUS, {"job": job}).fetchall()
    conn.commit()
    return [OutboxStatus(j, pending, set_aside) for j, pending, set_aside in rows]


def jobs(conn: psycopg.Connection) -> list[JobSummary]:
    """Each job and topic in the database: partitions, total, last commit, running now, skipped.

    The total is the topic-total row of ``txn_data``; where a job has none (an
    idempotent-sink job keeps its messages in ``txn_messages`` instead) it is the
    number of messages stored, counted in the same statement.
    """
    rows = conn.execute(
        f"SELECT o.job, o.topic, count(*), max(o.updated_at) FILTER (WHERE {COMMITTED}), coalesce(max(d.metric), "
        "    (SELECT count(*) FROM txn_messages m WHERE m.job = o.job AND m.topic = o.topic)), "
        "  (SELECT count(*) FROM txn_bad_messages b WHERE b.job = o.job AND b.topic = o.topic) "
        "FROM txn_offsets o LEFT JOIN txn_data d ON d.job = o.job AND d.topic = o.topic "
        "    AND d.grain = 'topic' AND d.key IS NULL AND d.window_start IS NULL "
        "GROUP BY o.job, o.topic ORDER BY o.job, o.topic"
    ).fetchall()
    conn.commit()
    running = {j: job_running(conn, j) for j in sorted({r[0] for r in rows})}
    return [
        JobSummary(j, t, n, plain_number(total), last, running[j], skipped)
        for j, t, n, last, total, skipped in rows
    ]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table; None shows as '-'."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def as_json(items: Sequence[Any]) -> str:
    return json.dumps([asdict(i) for i in items], default=lambda v: v.isoformat(), indent=2)


def format_status(rows: Sequence[PartitionStatus]) -> str:
    return table(
        [
            "JOB",
            "TOPIC",
            "PARTITION",
            "OFFSET",
            "GENERATION",
            "LOG-START",
            "LOG-END",
            "LAG",
            "LAST-COMMIT",
            "RUNNING",
            "SKIPPED",
        ],
        [
            (
                r.job,
                r.topic,
                r.partition,
                r.offset,
                r.generation,
                r.log_start,
                r.log_end,
                r.lag,
                _last_commit(r.last_commit),
                "yes" if r.running else "no",
                r.skipped,
            )
            for r in rows
        ],
    )


def format_outbox(rows: Sequence[OutboxStatus]) -> str:
    return table(
        ["JOB", "OUTBOX-PENDING", "OUTBOX-SET-ASIDE"], [(r.job, r.pending, r.set_aside) for r in rows]
    )


def format_jobs(rows: Sequence[JobSummary]) -> str:
    return table(
        ["JOB", "TOPIC", "PARTITIONS", "TOTAL", "LAST-COMMIT", "RUNNING", "SKIPPED"],
        [
            (
                r.job,
                r.topic,
                r.partitions,
                r.total,
                _last_commit(r.last_commit),
                "yes" if r.running else "no",
                r.skipped,
            )
            for r in rows
        ],
    )


def _last_commit(when: datetime | None) -> str:
    return NEVER if when is None else when.isoformat(timespec="seconds")

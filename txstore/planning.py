"""Planning a batch: the ranges to run, from the database and Kafka (steps 1-4 of a batch).

1. read the job's committed offsets from ``txn_offsets`` (never from Spark
   checkpoints);
2. ask Kafka for every partition's watermarks (after step 1, so that an
   offset another instance commits meanwhile is never above them);
3. give partitions without a row their starting offset (``INSERT .. ON
   CONFLICT DO NOTHING``, then re-read, so concurrent starters agree), and
   with ``fail_on_data_loss`` off move past aged-out offsets, recording them;
4. plan one range per partition with new data (capped by
   ``max_offsets_per_batch``); none means no Spark job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from txstore.core.assignment import assigned_only
from txstore.core.errors import (
    PRIVILEGE_HINT,
    DatabaseUnavailable,
    PermissionDenied,
    UnknownTopic,
    first_line,
)
from txstore.core.idle import IdlePlan, idle_plan, next_is_idle
from txstore.core.patterns import PatternTopics, joining_starts, resolve_pattern
from txstore.core.ranges import (
    IDLE_TOPIC_ID_SECONDS,
    OffsetRange,
    PartitionHistory,
    PartitionWatermarks,
    TopicPartition,
    aged_out,
    limit_ranges,
    plan_ranges,
    recreated_topics,
    topic_ids_to_store,
    topic_ids_wanted,
    without_vanished,
)
from txstore.core.starting import StartDecision, resolve_starting_offsets, times_to_look_up
from txstore.core.subscription import subscription_of
from txstore.kafka.client import Watermarks, fetch_topic_names
from txstore.kafka.list_offsets import offsets_for_times
from txstore.kafka.topic_ids import TopicIds
from txstore.postgres import store
from txstore.settings import JobSettings

log = logging.getLogger("txstore")

WatermarksSource = Callable[[Mapping[str, Any], Sequence[str]], list[PartitionWatermarks]]
TopicNamesSource = Callable[[Mapping[str, Any]], list[str]]


class Planner:
    """Plans a job's batches; keeps each partition's history (fingerprint, topic ID) between them."""

    def __init__(
        self,
        settings: JobSettings,
        watermarks: WatermarksSource,
        topic_ids: TopicIds | None = None,
        topic_names: TopicNamesSource | None = None,
    ) -> None:
        """``topic_ids`` is asked only with the job's own Kafka clients (else None: no topic IDs).
        ``topic_names`` lists Kafka's topics for a ``topic_pattern`` (default: a new client each time)."""
        self.settings = settings
        self.watermarks = watermarks
        self.topic_ids_source = topic_ids
        self.topic_names = topic_names or fetch_topic_names
        self.topics: tuple[str, ...] = settings.topics
        """The topics the last plan covered: ``settings.topics``, or a pattern's resolution."""
        self.resolved: PatternTopics | None = None
        """A pattern's last resolution (None without a pattern)."""
        self._told: tuple[str, ...] | None = None  # the matched topics last logged
        self._subscribed = False  # the job's subscription recorded (txn_subscriptions), once a run
        self.history: dict[TopicPartition, PartitionHistory] = {}
        self.backlog: dict[TopicPartition, int] = {}
        """Per partition, the last plan's log end minus committed offset (before any cap)."""
        self._ids: dict[str, str | None] = {}  # Kafka's topic IDs asked this plan (None: none)
        self._ids_checked: dict[str, float] = {}  # per topic, when its ID was last asked (monotonic)
        self._rows_version = ""  # the job's rows' version as the last full plan read them
        self._idle: IdlePlan | None = None  # the last plan, while it is idle (:mod:`txstore.core.idle`)
        self._kept = watermarks if isinstance(watermarks, Watermarks) else None  # the job's own client

    def plan(self, connection: Callable[[], psycopg.Connection]) -> list[OffsetRange]:
        """Steps 1-4 on the driver's ``connection()``; PostgreSQL errors become one line
        (:class:`PermissionDenied`, :class:`DatabaseUnavailable`)."""
        s = self.settings
        self._ids = {}
        try:
            conn = connection()
            if not self._subscribed:
                store.record_subscription(
                    conn, s.job, subscription_of(s.topics, s.topic_pattern, s.assignment)
                )
                self._subscribed = True
            if self._idle is not None and self._kept is not None:
                if self._still_idle(conn, self._idle, self._kept):
                    return []  # the backlog is the last plan's: every partition at its end
                self._idle = None
            committed, watermarks = self._state(conn)
            # Both steps, always: a batch may start new partitions and skip aged-out offsets at once.
            started = self._start_new_partitions(conn, committed, watermarks)
            skipped = self._skip_lost(conn, committed, watermarks)
            if started or skipped:  # the same topics: one that starts matching meanwhile waits
                committed, watermarks = self._state(conn, resolve=False)
            self.backlog = {w.key: max(0, w.high - committed.get(w.key, w.high)) for w in watermarks}
            topic_ids = self._topic_ids(conn, committed, watermarks)
            ranges = plan_ranges(s.job, committed, watermarks, self.history, topic_ids)
            if self._kept is not None:  # rows and log ends as read last (after any start or skip)
                self._idle = idle_plan(
                    self.topics,
                    self._rows_version,
                    committed,
                    watermarks,
                    ranges,
                    self._ids_checked,
                    time.monotonic(),
                    IDLE_TOPIC_ID_SECONDS,
                )
            return limit_ranges(ranges, s.max_offsets_per_batch)
        except psycopg.errors.InsufficientPrivilege as e:
            raise PermissionDenied(
                f"planning job {s.job!r}: PostgreSQL said {first_line(e)}; {PRIVILEGE_HINT}"
            ) from None
        except psycopg.Error as e:
            raise DatabaseUnavailable(
                f"planning job {s.job!r} failed in PostgreSQL: {first_line(e)}"
            ) from None

    def _state(
        self, conn: psycopg.Connection, resolve: bool = True
    ) -> tuple[dict[TopicPartition, int], list[PartitionWatermarks]]:
        # Offsets first, watermarks after: then every legitimately committed
        # offset is at or below the log end we plan with, even while another
        # instance of the job commits in between.
        s = self.settings
        topics = self._resolve_topics(conn) if resolve else self.topics
        rows, self._rows_version = store.versioned_rows(conn, s.job, topics)
        committed, self.history = store.state_of(rows)
        while True:
            try:
                if self._kept is not None:  # the job's own: idle partitions asked less
                    watermarks = self._kept(s.kafka_conf, topics, settled=committed)
                else:
                    watermarks = self.watermarks(s.kafka_conf, topics)
                break
            except UnknownTopic as e:
                stored = sum(1 for topic, _ in committed if topic == e.topic)
                topics = self.topics = without_vanished(s.job, e, topics, stored, s.pattern is not None)
        # --assign: only the assigned partitions are planned (a row no longer assigned is kept).
        watermarks, committed = assigned_only(s.assignment, watermarks, committed, "--assign")
        return committed, watermarks

    def _still_idle(self, conn: psycopg.Connection, plan: IdlePlan, kafka: Watermarks) -> bool:
        """Whether this plan is ``plan`` again (:func:`~txstore.core.idle.next_is_idle`): the
        job's rows, then its partitions' log ends with the kept client and no metadata request."""
        s = self.settings
        return next_is_idle(
            plan,
            lambda: store.rows_version(conn, s.job, plan.topics),
            lambda: kafka.ends(s.kafka_conf, list(plan.ends)),
            time.monotonic,
        )

    def _resolve_topics(self, conn: psycopg.Connection) -> tuple[str, ...]:
        """The topics to plan: the settings', or what the pattern matches on Kafka now together
        with the matching topics the job has offsets for (one that vanished is then found
        missing, and stops the job as a vanished topic does)."""
        s = self.settings
        pattern = s.pattern
        if pattern is None:
            return s.topics
        stored = store.job_topics(conn, s.job)  # the job's rows first, Kafka's list after
        self.resolved = resolve_pattern(pattern, self.topic_names(s.kafka_conf), stored)
        self.topics = self.resolved.topics
        matched = self.resolved.matched
        if matched != self._told:
            if not matched:
                log.info(
                    "job %s: --topic-pattern %r matches no topic on Kafka yet; nothing to read",
                    s.job,
                    s.topic_pattern,
                )
            else:
                log.info(
                    "job %s: --topic-pattern %r matches %d topic%s: %s",
                    s.job,
                    s.topic_pattern,
                    len(matched),
                    "" if len(matched) == 1 else "s",
                    ", ".join(matched),
                )
            self._told = matched
        return self.topics

    def _topic_ids(
        self,
        conn: psycopg.Connection,
        committed: Mapping[TopicPartition, int],
        watermarks: Sequence[PartitionWatermarks],
    ) -> dict[str, str]:
        """Kafka's topic IDs where it reports them (asked with the job's own admin client only),
        of the topics :func:`~txstore.core.ranges.topic_ids_wanted` names (an idle topic whose
        IDs are stored is asked every few seconds, not every plan), stored in the rows that have
        none yet, so a later recreation is seen."""
        if self.topic_ids_source is None:
            return {}
        s = self.settings
        wanted = topic_ids_wanted(committed, watermarks, self.history, self._ids_checked, time.monotonic())
        ids = self._ids_of(wanted)
        store.record_topic_ids(conn, s.job, topic_ids_to_store(ids, self.history))
        return ids

    def _ids_of(self, topics: Sequence[str]) -> dict[str, str]:
        """Kafka's topic IDs of ``topics``, each topic asked at most once a plan."""
        missing = [t for t in topics if t not in self._ids]
        if missing and self.topic_ids_source is not None:
            found = self.topic_ids_source(self.settings.kafka_conf, missing)
            self._ids.update({t: found.get(t) for t in missing})
            asked = time.monotonic()
            self._ids_checked.update({t: asked for t in missing})
        return {t: i for t in topics if (i := self._ids.get(t)) is not None}

    def _start_new_partitions(
        self,
        conn: psycopg.Connection,
        committed: dict[TopicPartition, int],
        watermarks: list[PartitionWatermarks],
    ) -> bool:
        """Step 3; True if rows were created (or found created by another instance)."""
        s = self.settings
        new = [w for w in watermarks if w.key not in committed]
        started = {topic for topic, _ in committed}
        joining: list[StartDecision] = []
        if self.resolved is not None:
            # A topic that starts matching after the first run joins at earliest, as in Spark.
            joining = joining_starts(self.resolved, new, "--topic-pattern")
            joined = {(d.topic, d.partition) for d in joining}
            new = [w for w in new if w.key not in joined]
            started |= {d.topic for d in joining}
        wanted = times_to_look_up(s.starting_offsets, [w.key for w in new], started)
        by_time = self._offsets_for_times(wanted) if wanted else None
        decisions = joining + resolve_starting_offsets(
            s.starting_offsets, new, [w.key for w in watermarks], started, by_time, s.subscribed_by
        )
        if not decisions:
            return False
        created = store.create_start_rows(conn, s.job, decisions)
        for d in decisions:
            if (d.topic, d.partition) in created:
                log.info("job %s: %s/%d starts at %s", s.job, d.topic, d.partition, d.reason)
            else:
                log.info("job %s: %s/%d was started by another instance", s.job, d.topic, d.partition)
        return True

    def _offsets_for_times(self, wanted: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Kafka's offsets for times, through the job's own admin client where it has one (a new
        client waits for its first answer: :class:`~txstore.kafka.admin.Admin`)."""
        admin = self._kept.admin_for(self.settings.kafka_conf) if self._kept is not None else None
        return offsets_for_times(self.settings.kafka_conf, wanted, admin=admin)

    def _skip_lost(
        self,
        conn: psycopg.Connection,
        committed: dict[TopicPartition, int],
        watermarks: list[PartitionWatermarks],
    ) -> bool:
        """With ``fail_on_data_loss`` off: move past aged-out offsets, recording them.

        With it on, the planner refuses them instead (:class:`DataLoss`).
        """
        s = self.settings
        lost = [] if s.fail_on_data_loss else aged_out(committed, watermarks)
        if lost and self.topic_ids_source is not None:
            # A recreated topic's offsets are not the old one's: its topic ID stops the plan.
            recreated = recreated_topics(self.history, self._ids_of(sorted({r.topic for r in lost})))
            lost = [r for r in lost if r.topic not in recreated]
        if not lost:
            return False
        for r in store.record_lost_ranges(conn, s.job, lost):
            log.warning(
                "job %s: %s/%d: offsets %d -> %d (%d messages) aged out of Kafka before they were "
                "counted; skipped and recorded in txn_lost_ranges (--fail-on-data-loss false)",
                s.job,
                r.topic,
                r.partition,
                r.from_offset,
                r.until_offset,
                r.size,
            )
        return True

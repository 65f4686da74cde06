"""The stream source's partitions: which topics and partitions its subscription names, what
Kafka reports for them (log offsets, topic IDs), the job's rows for them, and where a partition
without a row starts.

:class:`QueryPartitions` is a mixin of :class:`~txstore.spark.stream.stream_source.TxstoreStreamReader`
(over :class:`~txstore.spark.stream.stream_session.PlanningSession`, whose connection it reads and
writes the job's rows through). Its clients (Kafka's log offsets, topic IDs) are kept for the
query's life, as a job keeps its. Steps of a planning call, each a method:

- :meth:`~QueryPartitions._job_state`: the job's rows for the query's topics (with ``assign``, of
  the assigned partitions; with ``subscribePattern``, of the job's topics it matches), its
  subscription recorded once a query (``txn_subscriptions``, for ``txstore status``);
- :meth:`~QueryPartitions._watermarks`: Kafka's log offsets for ``subscribe``'s topics, or those
  ``subscribePattern`` matches now (:meth:`~QueryPartitions._resolve_topics`); a topic gone that the
  job has rows for stops the query (as ``count_topic``); an assigned partition Kafka does not
  report is refused once a query;
- :meth:`~QueryPartitions._start_decisions` and :meth:`~QueryPartitions._start_rows`: where each
  partition without a row starts (``startingOffsets``, or earliest in a topic the job started, or
  in one a pattern starts to match), stored as its row when decided;
- :meth:`~QueryPartitions._topic_ids`: Kafka's topic IDs, asked only as
  :func:`~txstore.core.ranges.topic_ids_wanted` says, stored in rows that have none.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence

import psycopg

from txstore.core.assignment import assigned_keys, assigned_only
from txstore.core.errors import UnknownTopic
from txstore.core.patterns import PatternTopics, joining_starts, matching_topics, resolve_pattern
from txstore.core.ranges import (
    PartitionHistory,
    PartitionWatermarks,
    TopicPartition,
    topic_ids_to_store,
    topic_ids_wanted,
    without_vanished,
)
from txstore.core.starting import StartDecision, resolve_starting_offsets
from txstore.core.subscription import subscription_of
from txstore.kafka.client import Watermarks
from txstore.kafka.topic_ids import TopicIds
from txstore.postgres import store
from txstore.spark.runtime.worker_log import worker_info_to_stderr
from txstore.spark.source.read_planning import start_times
from txstore.spark.stream.stream_checkpoint import start_reason
from txstore.spark.stream.stream_session import PlanningSession

log = logging.getLogger("txstore")

_State = tuple[dict[TopicPartition, int], dict[TopicPartition, PartitionHistory]]
"""The job's rows: offsets and what is kept beside them (:func:`~txstore.postgres.store.committed_state`)."""


class QueryPartitions(PlanningSession):
    """The stream reader's view of its partitions (see the module docstring); its state is set by
    the reader's ``__init__``."""

    _kafka: Watermarks | None  # the planning methods' Kafka client for log offsets
    _ids: TopicIds | None  # and for topic IDs
    _ids_checked: dict[str, float]  # per topic, when its ID was last asked (monotonic)
    _rows_version: str  # the job's rows' version as last read, and their topics
    _row_topics: tuple[str, ...]
    _subscribed: bool  # the job's subscription recorded (txn_subscriptions), once a reader
    _assignment_checked: bool  # assign: its partitions checked against Kafka's, once
    _resolved: PatternTopics | None  # subscribePattern: the last resolution
    _topics: tuple[str, ...]  # the topics the planning methods use
    _told: tuple[str, ...] | None  # the matched topics last logged

    def _watermarks(self, settled: Mapping[TopicPartition, int] | None = None) -> list[PartitionWatermarks]:
        """Kafka's log offsets, through one admin client for the query's life (a new client a call
        took 2-67 ms against the test broker, a kept one under 1 ms; it is replaced after a
        failed call). ``settled``: offsets a micro-batch starts at, of partitions the job has rows
        for; one at its log end is not asked its log start (:class:`Watermarks`)."""
        kafka = self._kept()
        topics = self._resolve_topics(kafka)
        while True:
            try:
                reported = kafka(self.options.read.kafka_conf, topics, settled=settled)
                break
            except UnknownTopic as e:
                job = self.options.job
                stored = sum(1 for t, _ in store.committed_offsets(self._db(), job, [e.topic]))
                topics = self._topics = without_vanished(job, e, topics, stored, self._resolved is not None)
        assignment = self.options.read.assignment
        if assignment is None:
            return reported
        if not self._assignment_checked:  # once a query: an assigned partition Kafka does not have
            rows = store.committed_offsets(self._db(), self.options.job, self.options.read.topics)
            assigned_only(assignment, reported, rows, f"option {self.options.read.name('assign')}")
            self._assignment_checked = True
        assigned = assigned_keys(assignment)
        return [w for w in reported if w.key in assigned]

    def _kept(self) -> Watermarks:
        """The query's Kafka client, made at its first use. Its admin client
        (:meth:`Watermarks.admin_for`) asks the topic IDs and offsets for times too, so they wait
        for no new client's first answer (:class:`~txstore.kafka.admin.Admin`)."""
        if self._kafka is None:
            self._kafka = Watermarks()
        return self._kafka

    def _resolve_topics(self, kafka: Watermarks) -> tuple[str, ...]:
        """The topics to plan: ``subscribe``'s, or what ``subscribePattern`` matches on Kafka now
        with the matching topics the job has offsets for (one that vanished is then found missing
        and stops the query as a vanished topic does)."""
        read = self.options.read
        if read.pattern is None:
            return read.topics
        stored = store.job_topics(self._db(), self.options.job)  # the job's rows first, Kafka's after
        self._resolved = resolve_pattern(re.compile(read.pattern), kafka.topic_names(read.kafka_conf), stored)
        self._topics = self._resolved.topics
        matched = self._resolved.matched
        if matched != self._told:
            name = read.name("subscribePattern")
            if matched:
                log.info(
                    "job %s: option %s %r matches %s",
                    self.options.job,
                    name,
                    read.pattern,
                    ", ".join(matched),
                )
            else:
                log.info(
                    "job %s: option %s %r matches no topic on Kafka yet; nothing to read",
                    self.options.job,
                    name,
                    read.pattern,
                )
            self._told = matched
        return self._topics

    def _job_state(self, conn: psycopg.Connection) -> _State:
        """The job's rows for the query's topics: with ``assign``, of the assigned partitions only
        (a row of a partition no longer assigned is kept, not planned); with ``subscribePattern``,
        of the job's topics the pattern matches."""
        read = self.options.read
        if not self._subscribed:
            store.record_subscription(
                conn, self.options.job, subscription_of(read.topics, read.pattern, read.assignment)
            )
            self._subscribed = True
        topics: Sequence[str] = read.topics
        if read.pattern is not None:
            topics = matching_topics(re.compile(read.pattern), store.job_topics(conn, self.options.job))
        rows, self._rows_version = store.versioned_rows(conn, self.options.job, topics)
        self._row_topics = tuple(topics)
        committed, history = store.state_of(rows)
        assignment = self.options.read.assignment
        if assignment is None:
            return committed, history
        assigned = assigned_keys(assignment)
        return (
            {k: v for k, v in committed.items() if k in assigned},
            {k: v for k, v in history.items() if k in assigned},
        )

    def _topic_ids(
        self,
        conn: psycopg.Connection,
        history: Mapping[TopicPartition, PartitionHistory],
        starts: Mapping[TopicPartition, int],
        watermarks: Sequence[PartitionWatermarks],
    ) -> dict[str, str]:
        """Kafka's topic IDs where it reports them, through one client for the query's life (a broker
        without them is asked once: :class:`~txstore.kafka.topic_ids.TopicIds`), stored in the job's
        rows that have none yet (``history``), so a later recreation is seen (as ``count_topic``).
        Only the topics :func:`~txstore.core.ranges.topic_ids_wanted` names for ``starts`` and
        ``watermarks`` are asked: an idle micro-batch's topics, whose IDs are stored, every few
        seconds, not every micro-batch."""
        wanted = topic_ids_wanted(starts, watermarks, history, self._ids_checked, time.monotonic())
        if not wanted:
            return {}
        if self._ids is None:
            self._ids = TopicIds(self._kept().admin_for)  # one admin client for both
        ids = self._ids(self.options.read.kafka_conf, wanted)
        asked = time.monotonic()
        self._ids_checked.update({t: asked for t in wanted})
        store.record_topic_ids(conn, self.options.job, topic_ids_to_store(ids, history))
        return ids

    def _start_decisions(
        self, stored: Mapping[TopicPartition, int], watermarks: Sequence[PartitionWatermarks]
    ) -> list[StartDecision]:
        """Where the job starts each partition Kafka reports that it has no row for: its
        ``startingOffsets`` in a topic it never started, the log's earliest offset in one it did."""
        new = [w for w in watermarks if w.key not in stored]
        if not new:  # every micro-batch: no new partition, nothing to decide (nor to check)
            return []
        started = {t for t, _ in stored}
        joining: list[StartDecision] = []
        if self._resolved is not None:  # a topic that starts matching later joins at earliest
            joining = joining_starts(self._resolved, new, self.options.read.name("subscribePattern"))
            joined = {(d.topic, d.partition) for d in joining}
            new = [w for w in new if w.key not in joined]
            started |= {d.topic for d in joining}
        # startingTimestamp / startingOffsetsByTimestamp: Kafka's offsets-for-times, for a first start
        read = self.options.read
        by_time = start_times(
            read, [w.key for w in new], started, lambda: self._kept().admin_for(read.kafka_conf)
        )
        return joining + resolve_starting_offsets(
            read.starting, new, [w.key for w in watermarks], started, by_time, read.subscribed_by
        )

    def _start_rows(
        self, conn: psycopg.Connection, decisions: Sequence[StartDecision], state: _State
    ) -> _State:
        """Store the decisions as the job's rows when they are taken (as the batch planner does, so
        a checkpoint's start is always compared with a row); the job's rows, read again if any were
        to be created (a row another instance created first wins), else ``state``."""
        if not decisions:
            return state
        job = self.options.job
        created = store.create_start_rows(conn, job, decisions)
        worker_info_to_stderr()
        for d in decisions:
            if (d.topic, d.partition) in created:
                log.info("job %s: %s/%d starts at %s", job, d.topic, d.partition, start_reason(d))
        return self._job_state(conn)

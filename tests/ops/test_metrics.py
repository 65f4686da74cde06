"""--metrics-port and --log-format json: what a job exposes after known batches, scraped over HTTP."""

from __future__ import annotations

import io
import json
import logging
import socket
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import produce, send
from tests.helpers.counting import Counting
from tests.helpers.job_processes import count_topic_args, run_job
from tests.kafka.test_bad_messages import MINUTE_MS, messages_with_bad_timestamps
from txstore.core.errors import BatchFailed, DatabaseUnavailable, PublishFailed
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.producers import close_producers
from txstore.postgres.db import connect
from txstore.postgres.outbox import OutboxPublisher
from txstore.postgres.sink import TransactionalSink
from txstore.report.logformat import JsonFormatter
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


def scrape(job: TransactionalJob) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """The exposition text from http://127.0.0.1:PORT/metrics, and each sample by name and labels."""
    assert job.metrics.port, "metrics are not served"
    with urllib.request.urlopen(f"http://127.0.0.1:{job.metrics.port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset({"job": "count_topic", **labels}.items()))]


@pytest.mark.parametrize("commit", ["per-range", "per-batch"])
def test_metrics_count_messages_lag_batches_and_commit_times_after_known_batches(
    counting: Counting, commit: str
) -> None:
    a, b = counting.new_topic(2), counting.new_topic(1)
    counting.produce(a, {0: 5, 1: 7})
    counting.produce(b, {0: 3})
    with counting.job(a, b, metrics_port=0, commit=commit) as job:
        job.run_batch()
        text, samples = scrape(job)
        assert value(samples, "txstore_messages_total", topic=a) == 12
        assert value(samples, "txstore_messages_total", topic=b) == 3
        assert value(samples, "txstore_lag_messages", topic=a, partition="0") == 5
        assert value(samples, "txstore_lag_messages", topic=a, partition="1") == 7
        assert value(samples, "txstore_lag_messages", topic=b, partition="0") == 3
        assert value(samples, "txstore_batches_total", outcome="ok") == 1
        assert value(samples, "txstore_batches_total", outcome="idle") == 0
        assert value(samples, "txstore_batches_total", outcome="failed") == 0
        assert value(samples, "txstore_batch_duration_seconds_count") == 1
        # Per-range: each of the three ranges' commits; per-batch: the driver's one transaction.
        assert value(samples, "txstore_commit_duration_seconds_count") == (3 if commit == "per-range" else 1)
        assert value(samples, "txstore_last_commit_timestamp_seconds") > 1.7e9
        for le in ("0.01", "1.0", "600.0", "+Inf"):
            assert f'txstore_batch_duration_seconds_bucket{{job="count_topic",le="{le}"}} ' in text
        assert 'txstore_commit_duration_seconds_bucket{job="count_topic",le="0.01"} ' in text
        assert value(samples, "txstore_commit_conflicts_total", kind="already_committed") == 0

        job.run_batch()  # nothing new: an idle plan, lag 0
        _, samples = scrape(job)
        assert value(samples, "txstore_batches_total", outcome="idle") == 1
        assert value(samples, "txstore_batches_total", outcome="ok") == 1
        for topic, partition in ((a, "0"), (a, "1"), (b, "0")):
            assert value(samples, "txstore_lag_messages", topic=topic, partition=partition) == 0
        assert value(samples, "txstore_messages_total", topic=a) == 12

        # The lag is the backlog the plan saw, before --max-offsets-per-batch caps the batch.
        counting.produce(a, {0: 20})
        job.planner.settings = job.settings = replace(job.settings, max_offsets_per_batch=4)
        job.run_batch()
        _, samples = scrape(job)
        assert value(samples, "txstore_lag_messages", topic=a, partition="0") == 20
        assert value(samples, "txstore_messages_total", topic=a) == 16
    with pytest.raises(OSError):  # closed with the job
        urllib.request.urlopen(f"http://127.0.0.1:{job.metrics.port or 1}/metrics", timeout=5)


def test_ranges_found_already_committed_are_counted_as_conflicts(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = counting.new_topic(3)
    counting.produce(topic, {0: 4, 1: 5, 2: 6})
    # Each task's first attempt commits, then fails before Spark hears of it; the retry finds it committed.
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "after-commit@first")
    with counting.job(topic, metrics_port=0) as job:
        job.run_batch()
        _, samples = scrape(job)
    assert value(samples, "txstore_commit_conflicts_total", kind="already_committed") == 3
    assert value(samples, "txstore_commit_conflicts_total", kind="gap") == 0
    assert value(samples, "txstore_commit_conflicts_total", kind="overlap") == 0
    assert value(samples, "txstore_batches_total", outcome="ok") == 1


@pytest.mark.parametrize("commit", ["per-range", "per-batch"])
@pytest.mark.parametrize(("moved_to", "kind"), [(3, "gap"), (15, "overlap")])
def test_a_gap_or_overlap_found_at_commit_is_counted_as_a_conflict_and_a_failed_batch(
    counting: Counting, commit: str, moved_to: int, kind: str
) -> None:
    topic = counting.new_topic(1)
    counting.produce(topic, {0: 10})
    counting.job(topic).run_batch()
    counting.produce(topic, {0: 10})
    with counting.job(topic, metrics_port=0, commit=commit) as job:
        planned = job.plan()
        # Someone moves the stored offset between planning and committing.
        counting.db.execute("UPDATE txn_offsets SET off = %s WHERE topic = %s", (moved_to, topic))
        with pytest.raises(BatchFailed, match=kind):
            job.execute(planned)
        _, samples = scrape(job)
    assert value(samples, "txstore_commit_conflicts_total", kind=kind) == 1
    assert value(samples, "txstore_commit_conflicts_total", kind="already_committed") == 0
    assert value(samples, "txstore_batches_total", outcome="failed") == 1
    assert value(samples, "txstore_batches_total", outcome="ok") == 0
    # Nothing was committed by this process: no message counted for the topic.
    assert (
        "txstore_messages_total",
        frozenset({"job": "count_topic", "topic": topic}.items()),
    ) not in samples


def test_skipped_bad_messages_and_the_outbox_backlog_are_exposed_when_those_features_are_on(
    counting: Counting,
) -> None:
    topic, results = counting.new_topic(2), counting.new_topic(1, prefix="results")
    bad = {(0, 1), (1, 0), (1, 7)}
    send(counting.kafka.bootstrap_servers, topic, messages_with_bad_timestamps(2, 10, bad))
    s = JobSettings(
        "count_topic",
        (topic,),
        counting.kafka.bootstrap_servers,
        counting.database_url,
        on_bad_message="skip",
        publish_topic=results,
        metrics_port=0,
    )
    try:
        with TransactionalJob(counting.spark, s, CountMessages(window_ms=MINUTE_MS)) as job:
            job.run_batch()
            _, samples = scrape(job)
    finally:
        close_producers()
    assert value(samples, "txstore_bad_messages_total") == 3
    assert value(samples, "txstore_messages_total", topic=topic) == 20  # read and committed, bad ones too
    assert value(samples, "txstore_outbox_pending") == 0  # all published after the batch


def test_the_outbox_backlog_is_exposed_when_publishing_fails(counting: Counting) -> None:
    topic, results = counting.new_topic(2), counting.new_topic(1, prefix="results")
    counting.produce(topic, {0: 3, 1: 4})
    s = JobSettings(
        "pub",
        (topic,),
        counting.kafka.bootstrap_servers,
        counting.database_url,
        publish_topic=results,
        metrics_port=0,
    )
    try:
        with TransactionalJob(counting.spark, s, CountMessages()) as job:
            job.run_batch()
            # Committed while the broker is down: the rows wait in the outbox.
            with connect(counting.database_url) as conn:
                sink = TransactionalSink(conn, "pub", publish_to=results)
                counting.kafka.set_broker_down(1)
                try:
                    for p, end in ((0, 3), (1, 4)):
                        sink.commit(OffsetRange(topic, p, end, end + 10), {TOPIC_TOTAL: 10})
                    job._publisher = OutboxPublisher(s.kafka_conf, "pub", timeout=3.0)
                    with pytest.raises(PublishFailed):
                        job.publish()
                finally:
                    counting.kafka.set_broker_up(1)
            _, samples = scrape(job)
            assert samples[("txstore_outbox_pending", frozenset({("job", "pub")}))] == 2
            assert job.publish() == 2
            _, samples = scrape(job)
            assert samples[("txstore_outbox_pending", frozenset({("job", "pub")}))] == 0
    finally:
        close_producers()


def test_the_outbox_and_bad_message_metrics_are_absent_when_those_features_are_off(
    counting: Counting,
) -> None:
    with counting.job(counting.new_topic(1), metrics_port=0) as job:
        text, _ = scrape(job)
    assert "txstore_outbox_pending" not in text and "txstore_bad_messages" not in text
    assert "txstore_batches_total" in text


def test_a_batch_failing_to_plan_is_counted_and_metrics_stay_served_for_the_next(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    unreachable = "postgresql://postgres@127.0.0.1:5432/txstore_no_such_database?connect_timeout=5"
    with TransactionalJob(
        None,
        JobSettings("count_topic", (new_topic(1),), kafka.bootstrap_servers, unreachable, metrics_port=0),
        CountMessages(),
    ) as job:
        for attempt in (1, 2):
            with pytest.raises(DatabaseUnavailable):
                job.run_batch()
            _, samples = scrape(job)
            assert value(samples, "txstore_batches_total", outcome="failed") == attempt
            assert value(samples, "txstore_batch_duration_seconds_count") == attempt


def test_without_a_metrics_port_nothing_is_served_or_registered(counting: Counting) -> None:
    topic = counting.new_topic(1)
    with counting.job(topic) as job:
        assert not job.metrics.enabled and job.metrics.port == 0
        assert not hasattr(job.metrics, "registry")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The txstore logger's lines as --log-format json writes them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("txstore")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def logged(json_log: io.StringIO, event: str) -> list[dict[str, Any]]:
    """The json lines ``json_log`` holds of ``event`` ("range", "batch"), in their order."""
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    return [x for x in lines if x.get("event") == event]


def test_json_log_lines_carry_the_batch_and_range_numbers(counting: Counting, json_log: io.StringIO) -> None:
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 6, 1: 9})
    with counting.job(topic) as job:
        report = job.run_batch()
        job.run_batch()
    ranges = sorted(logged(json_log, "range"), key=lambda x: x["partition"])
    batches = logged(json_log, "batch")
    assert [
        (r["topic"], r["partition"], r["from"], r["until"], r["messages"], r["outcome"]) for r in ranges
    ] == [
        (topic, 0, 0, 6, 6, "committed"),
        (topic, 1, 0, 9, 9, "committed"),
    ]
    assert all(r["error"] is None and r["read_ms"] >= 0 and r["commit_ms"] > 0 for r in ranges)
    assert all(r["job"] == "count_topic" and r["batch"] == 1 and r["level"] == "INFO" for r in ranges)
    first, idle = batches
    assert (first["batch"], first["ranges"], first["messages"], first["outcome"]) == (1, 2, 15, "ok")
    assert first["plan_ms"] == round(report.plan_ms, 3) and first["run_ms"] == round(report.run_ms, 3)
    assert first["commit_ms"] == round(sum(r.commit_ms for r in report.ranges), 3)
    assert first["message"].startswith("job count_topic batch 1: 2 ranges, 15 messages")
    assert (idle["batch"], idle["ranges"], idle["messages"], idle["outcome"]) == (2, 0, 0, "idle")


def test_a_metrics_port_in_use_is_one_line_and_exit_2(
    kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_job(
            *count_topic_args(kafka, database_url, topic, "--metrics-port", str(port)), timeout=60
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"count_topic: error: job 'count_topic': cannot serve metrics on 127.0.0.1:{port}"
    )
    assert "--metrics-port" in lines[0]


def test_a_job_process_logs_json_lines_with_log_format_json(
    kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 7})
    result = run_job(*count_topic_args(kafka, database_url, topic, "--log-format", "json"))
    assert result.returncode == 0, result.stderr[-3000:]
    ours = [json.loads(line) for line in result.stderr.splitlines() if line.startswith('{"time"')]
    batch = [x for x in ours if x.get("event") == "batch"]
    assert len(batch) == 1 and (batch[0]["messages"], batch[0]["outcome"]) == (7, "ok"), ours
    assert [(x["until"], x["messages"]) for x in ours if x.get("event") == "range"] == [(7, 7)]


def test_per_batch_range_lines_carry_no_made_up_read_or_commit_times(
    counting: Counting, json_log: io.StringIO
) -> None:
    # Per batch, tasks aggregate pieces and the driver commits the whole batch: no range has a
    # read or commit time of its own, so its line gives none (not zeros); the batch gives its commit.
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 6, 1: 9})
    with counting.job(topic, commit="per-batch") as job:
        report = job.run_batch()
    ranges = logged(json_log, "range")
    (batch,) = logged(json_log, "batch")
    assert len(ranges) == 2
    assert all(r["read_ms"] is None and r["commit_ms"] is None for r in ranges), ranges
    assert all("read" not in r["message"] and " ms" not in r["message"] for r in ranges), ranges
    assert batch["read_ms"] is None and batch["commit_ms"] == round(report.commit_ms, 3) > 0
    assert "tasks read" not in batch["message"] and "commit " in batch["message"], batch["message"]

"""The CI subset of the streaming chaos trials (``python -m tests.chaos --stream``): two on the
test broker, one on real Apache Kafka, each mode once.

A trial is a ``readStream.format("txstore")`` -> ``writeStream.format("txstore")`` query in its own
process (tests/chaos/stream_job.py) under faults; it passes when everything Kafka holds (committed
messages only) is counted once, in ``txn_data`` or the results table, the stored offsets are the
log ends, and a clean instance got there within the bound (nothing wedged).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.quick_checks import assert_every_message_counted_once
from tests.chaos.runner import environment
from tests.chaos.stream import (
    STREAM_FAULT_KINDS,
    STREAM_REAL_KAFKA_KINDS,
    StreamPlan,
    StreamSummary,
    run_stream_trials,
)
from tests.conftest import pg_url

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

# seed, faults, mode. The driver killed between the sink's PostgreSQL commit and Spark's commit
# log, then an older copy of the checkpoint restored (the query must stop on the mismatch, or
# find the copy one batch back and replay it as already committed); the driver killed while a
# task reads, and the sink's session terminated inside its transaction, into a results table.
QUICK_STREAM: tuple[tuple[int, tuple[str, ...], str], ...] = (
    (201, ("kill-driver-after-commit", "checkpoint-restored"), "counts"),
    (202, ("kill-driver", "pg-terminate"), "table"),
)
# On real Kafka: the broker SIGKILLed inside the sink's commit, aborted transactions and
# partitions added to the live topic, counted with txstore.countMessages.
QUICK_STREAM_REAL: tuple[tuple[int, tuple[str, ...], str], ...] = (
    (203, ("kafka-killed-mid-commit", "aborted-transactions", "partitions-added"), "counted"),
)


def test_stream_plans_rotate_modes_and_never_draw_a_real_brokers_kind_on_the_mock() -> None:
    mock = [StreamPlan.generate_stream(seed) for seed in range(3 * len(STREAM_FAULT_KINDS))]
    assert {p.mode for p in mock} == {"counts", "counted", "table"}
    assert {p.faults[0] for p in mock} == set(STREAM_FAULT_KINDS)
    assert [p.seed for p in mock if set(p.faults) & set(STREAM_REAL_KAFKA_KINDS)] == []
    real = [StreamPlan.generate_stream(seed, kafka="real") for seed in range(60)]
    assert set(STREAM_REAL_KAFKA_KINDS) <= {p.faults[0] for p in real}
    with pytest.raises(ValueError, match="unknown stream fault kinds"):
        StreamPlan.generate_stream(1, ("partitions-added",))


def _run(tmp_path: Path, quick: tuple[tuple[int, tuple[str, ...], str], ...], kafka: str) -> StreamSummary:
    plans = [StreamPlan.generate_stream(seed, faults, kafka=kafka, mode=mode) for seed, faults, mode in quick]
    lines: list[str] = []
    with environment(pg_url("postgres"), tmp_path, kafka=kafka) as env:
        summary = run_stream_trials(
            env, plans, log=lines.append, summary=StreamSummary(quick[0][0], kafka=kafka)
        )
    report = assert_every_message_counted_once(summary, lines)
    assert all(r.counted > 0 for r in summary.results), report
    planned = {kind for _, faults, _ in quick for kind in faults}
    assert sorted(k for k in planned if summary.injected[k] == 0) == [], report
    # each kill between the sink's COMMIT and Spark's commit log is a replay the sink recognises,
    # except in a checkpoint's batch 0: Spark plans its replay from initialOffset() again, which
    # is then the stored offsets, so it reads nothing (test_streaming.py proves that alone)
    replays = sum(r.events["already-committed"] for r in summary.results)
    first = sum(r.events["killed-in-batch-0"] for r in summary.results)
    assert replays >= summary.injected["kill-driver-after-commit"] - first, report
    return summary


@pytest.mark.timeout(1500)
def test_a_streaming_query_killed_around_its_commit_and_given_an_older_checkpoint_counts_every_message_once(
    tmp_path: Path,
) -> None:
    _run(tmp_path, QUICK_STREAM, "mock")


def test_a_stream_runs_trial_lines_summarize_to_the_stream_summary(tmp_path: Path) -> None:
    from tests.chaos.__main__ import main
    from tests.chaos.runner import TrialResult

    result = TrialResult(StreamPlan.generate_stream(7), produced=10, counted=10)
    result.injected.update({"checkpoint-restored": 1, "kill-driver-after-commit": 2})
    failed = TrialResult(StreamPlan.generate_stream(8), produced=5, counted=5)
    failed.failures.append("TimeoutError: wedged: offsets {0: 1} did not reach the log ends {0: 2}")
    log = tmp_path / "run.log"
    log.write_text(f"  {result.line()}\n  {failed.line()}\n")
    summary = StreamSummary(kafka="mock")
    for r in (result, failed):
        summary.add(r)
    summary.seed = 7
    assert "checkpoint-restored=1 second-instance=0" in summary.line()
    assert summary.line().endswith("duplicated 0, wedged 1; failed trials: 8")
    assert main(["--stream", "--summarize", str(log)]) == 1


def test_a_stream_catch_up_waits_for_the_checkpoint_to_commit_its_last_planned_batch_and_names_the_stalled_one(
    tmp_path: Path,
) -> None:
    from tests.chaos.stream import checkpoint_caught_up, stalled_batch

    assert checkpoint_caught_up(tmp_path / "never-started")
    assert stalled_batch(tmp_path / "never-started") is None
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir()
    for name in ("offsets/0", "offsets/1", "commits/0", "commits/.0.crc", "offsets/.1.crc"):
        (tmp_path / name).write_text("")
    assert not checkpoint_caught_up(tmp_path)  # killed after the sink's COMMIT: batch 1 to replay
    assert stalled_batch(tmp_path) == 1
    (tmp_path / "commits" / "1").write_text("")
    assert checkpoint_caught_up(tmp_path)
    assert stalled_batch(tmp_path) is None
    (tmp_path / "offsets" / "10").write_text("")  # batch ids compare as numbers, not names
    assert not checkpoint_caught_up(tmp_path)

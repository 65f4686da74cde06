"""The CI subset of the chaos suite: eight trials that together inject every fault kind,
one on Spark Connect, and two on real Apache Kafka.

The long run is ``python -m tests.chaos --trials 200`` (see the README).
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.chaos.quick_checks import assert_every_message_counted_once
from tests.chaos.runner import (
    CONNECT_EXCLUDED,
    FAULT_KINDS,
    REAL_KAFKA_EXCLUDED,
    REAL_KAFKA_FAULT_KINDS,
    REAL_KAFKA_FIRST_KINDS,
    REAL_KAFKA_OPT_IN,
    Summary,
    TrialPlan,
    environment,
    kinds_for,
    run_trials,
)
from tests.conftest import pg_url
from tests.helpers.real_kafka_fixture import jars_or_skip
from tests.helpers.spark_connect import SparkConnectServer
from txstore.testing.real_kafka import kafka_jars

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

# Faults that wait for a task in flight are kept apart from the driver fail points,
# whose crashes leave the job restarting for much of a short trial. Three trials count
# per key or commit per batch (the sink's fail points then fire in the driver).
QUICK: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = (
    (101, ("kill-python-worker", "fp-after-commit", "pg-terminate"), ("--by", "key")),
    (
        102,
        ("kill-driver", "fp-before-upsert", "kafka-down"),
        ("--commit", "per-batch", "--min-partitions", "8"),
    ),
    (103, ("second-instance", "fp-between-upsert-and-offsets", "pg-unreachable", "fp-after-plan"), ()),
    # A frozen database network while a second instance starts mid-batch. (It rode with
    # seed 107's recreation until a CI run where the job had stopped on the recreation
    # before the freeze's time came, so the freeze was never injected.)
    (
        104,
        ("instance-during-batch", "fp-before-commit", "pg-frozen"),
        ("--by", "key", "--commit", "per-batch"),
    ),
    (105, ("fp-between-batches", "kafka-request-errors", "kafka-frozen"), ()),
    (106, ("speculation", "fp-after-commit"), ()),
    # The events the job stops on (tests/chaos/events.py): a recreated topic refilled past
    # the stored offsets (seed 107's draw); a poison
    # message stopped on (--on-bad-message fail, seed 112's draw) while results are
    # published in parts.
    (107, ("topic-recreated",), ("--by", "key")),
    (112, ("poison-message", "oversized-publish"), ()),
)


# On Spark Connect (the job a client of the tests' Connect server, --remote sc://): one trial
# with the kinds whose mechanics differ there. The client is killed mid-batch while the
# server may still finish that batch's tasks; a Python worker of the server's executor is
# killed mid-task; a task fail point fires in the server's workers (shipped with the
# task, reported in the server's log); a second client runs the same job on the same
# server. The database, Kafka and driver-loop kinds behave as on classic (the job's
# plan and commits are the same code) and stay in the classic trials above; speculation
# does not run under Connect (runner.CONNECT_EXCLUDED). One trial, because the CI suite's
# budget is minutes: it shares the session's Connect server with tests/e2e/test_connect_jobs.py.
QUICK_CONNECT: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = (
    (121, ("kill-driver", "kill-python-worker", "fp-before-commit", "second-instance"), ("--by", "key")),
)


# On real Apache Kafka (tests/chaos/real_broker.py: the jobs reach it only through a proxy it
# advertises): the broker SIGKILLed and restarted while a task reads and while one is inside its
# commit transaction, a transactional producer committing some transactions and aborting others,
# and the jobs' Kafka network dropped and frozen at the proxy. Two trials, so that the kills and
# the frozen network each have a trial's batches to themselves; the broker starts once (~10 s).
QUICK_REAL: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = (
    (131, ("kafka-killed-mid-read", "aborted-transactions", "kafka-down"), ("--by", "key")),
    (132, ("kafka-killed-mid-commit", "kafka-frozen"), ("--commit", "per-batch")),
)


def test_the_quick_plans_cover_every_fault_kind() -> None:
    assert {kind for _, faults, _ in QUICK for kind in faults} == set(FAULT_KINDS)


@pytest.mark.timeout(1500)
def test_under_every_kind_of_fault_every_message_is_counted_exactly_once(tmp_path: Path) -> None:
    plans = [TrialPlan.generate(seed, faults, intense=True, job_args=args) for seed, faults, args in QUICK]
    lines: list[str] = []
    with environment(pg_url("postgres"), tmp_path) as env:
        summary = run_trials(env, plans, log=lines.append, summary=Summary(seed=QUICK[0][0]))
    report = assert_every_message_counted_once(summary, lines)
    assert sum(r.produced for r in summary.results) > 0
    assert [k for k in FAULT_KINDS if summary.injected[k] == 0] == [], report


@pytest.mark.connect
@pytest.mark.timeout(900)
def test_on_spark_connect_under_client_and_worker_kills_every_message_is_counted_exactly_once(
    spark_connect_server: SparkConnectServer, tmp_path: Path
) -> None:
    plans = [
        TrialPlan.generate(seed, faults, intense=True, job_args=args, connect=True)
        for seed, faults, args in QUICK_CONNECT
    ]
    lines: list[str] = []
    with environment(pg_url("postgres"), tmp_path, connect_server=spark_connect_server) as env:
        summary = run_trials(env, plans, log=lines.append, summary=Summary(seed=QUICK_CONNECT[0][0]))
    report = assert_every_message_counted_once(summary, lines)
    assert sum(r.produced for r in summary.results) > 0
    planned = {kind for _, faults, _ in QUICK_CONNECT for kind in faults}
    assert sorted(k for k in planned if summary.injected[k] == 0) == [], report


def test_connect_plans_never_draw_a_kind_connect_excludes_and_run_as_clients() -> None:
    plans = [TrialPlan.generate(seed, connect=True) for seed in range(2 * len(FAULT_KINDS))]
    assert [p.seed for p in plans if set(p.faults) & set(CONNECT_EXCLUDED)] == []
    assert {p.launch for p in plans} == {"connect"}
    assert not any(p.standalone for p in plans)
    # Every other kind still comes first in some seed's rotation.
    assert {p.faults[0] for p in plans} == set(FAULT_KINDS) - set(CONNECT_EXCLUDED)


def test_the_quick_real_kafka_plans_cover_every_kafka_fault_kind() -> None:
    assert {kind for _, faults, _ in QUICK_REAL for kind in faults} == set(REAL_KAFKA_FIRST_KINDS)


def test_real_kafka_plans_start_with_a_kafka_fault_and_never_draw_what_does_not_run_there() -> None:
    plans = [TrialPlan.generate(seed, kafka="real") for seed in range(4 * len(REAL_KAFKA_FIRST_KINDS))]
    assert {p.faults[0] for p in plans} == set(REAL_KAFKA_FIRST_KINDS)
    assert [p.seed for p in plans if set(p.faults) & set(REAL_KAFKA_EXCLUDED)] == []
    assert {p.kafka for p in plans} == {"real"}
    # The mock's plans never draw a real broker's kinds, and keep their rotation.
    mock = [TrialPlan.generate(seed) for seed in range(2 * len(FAULT_KINDS))]
    assert [p.seed for p in mock if set(p.faults) & set(REAL_KAFKA_FAULT_KINDS)] == []
    assert [p.faults[0] for p in mock] == [FAULT_KINDS[s % len(FAULT_KINDS)] for s in range(len(mock))]
    with pytest.raises(ValueError, match="do not run on the mock broker"):
        TrialPlan.generate(1, ("aborted-transactions",))
    with pytest.raises(ValueError, match="do not run on the real broker"):
        TrialPlan.generate(1, ("kafka-request-errors",), kafka="real")
    # Opt-in there: run when asked for, never drawn.
    assert TrialPlan.generate(1, ("topic-recreated", "aborted-transactions"), kafka="real").faults == (
        "topic-recreated",
    )
    assert [p.seed for p in plans if set(p.faults) & set(REAL_KAFKA_OPT_IN)] == []
    assert set(kinds_for("real")) >= set(REAL_KAFKA_FIRST_KINDS)


@pytest.mark.timeout(600)
def test_on_real_kafka_under_broker_kills_aborted_transactions_and_a_frozen_network_every_message_is_counted_exactly_once(
    tmp_path: Path,
) -> None:
    jars_or_skip(kafka_jars)
    plans = [
        TrialPlan.generate(seed, faults, intense=True, job_args=args, kafka="real")
        for seed, faults, args in QUICK_REAL
    ]
    lines: list[str] = []
    with environment(pg_url("postgres"), tmp_path, kafka="real") as env:
        summary = run_trials(
            env, plans, log=lines.append, summary=Summary(seed=QUICK_REAL[0][0], kafka="real")
        )
        assert env.real_kafka is not None
        proxied, kills = env.real_kafka.proxy.accepted, env.real_kafka.kills
    report = assert_every_message_counted_once(summary, lines)
    assert sum(r.counted for r in summary.results) > 0, report
    planned = {kind for _, faults, _ in QUICK_REAL for kind in faults}
    assert sorted(k for k in planned if summary.injected[k] == 0) == [], report
    assert kills == 2, report
    assert proxied > 0, report  # the jobs' connections went through the proxy
    events = sum((r.events for r in summary.results), collections.Counter())
    assert events["transactions-aborted"] > 0 and events["transactions-committed"] > 0, report
    assert events["aborted-messages"] > 0, report

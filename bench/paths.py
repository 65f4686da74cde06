"""Execution paths side by side: the per-range count path and the DataFrame aggregate, on
classic Spark and on Spark Connect, over the same messages in the same run.

Eight jobs count the main workload's topic in each round, in an order that
rotates from round to round (so no path always runs first or last):

- ``classic per-range``: ``count_topic``'s default (tasks read, count and
  commit their ranges), on the benchmark's classic session;
- ``classic DataFrame``: the same totals as a DataFrame aggregate
  (``groupBy("topic").count()``, committed per batch), as a job runs it by
  default: a count grouped by a source column, so the reading tasks count
  per topic and the driver sums their counts (:mod:`txstore.spark.source.pushdown`,
  found once per job, before the clock);
- ``classic DataFrame, counted by Spark``: the same aggregate with
  ``push_down_counts=False``: Spark runs it over one row per message, of the
  columns its optimized plan uses (``topic``; :mod:`txstore.spark.source.used_columns`),
  as the default did before counts were pushed down;
- ``classic DataFrame, all columns``: the same, declaring every
  Kafka-source column, so all of them are built and handed to Spark (what
  the default did before either);
- ``Connect ...``: the same jobs through a
  Spark Connect client (``sc://``) of a local Spark Connect server with the
  same master, txstore shipped to it as an artifact as ``--remote`` does.

Every job is new and planned before the clock starts (as in the main
pairs), so each timed batch is a running job's batch over exactly the
workload; each stored topic total is checked against the messages produced.
Ratios are taken within a round (paths measured minutes apart on a shared
machine are not comparable) and their median is reported.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.workload import Workload
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS

PER_RANGE = "per-range"
DATAFRAME = "DataFrame"
DATAFRAME_SPARK_COUNTS = "DataFrame, counted by Spark"
DATAFRAME_ALL_COLUMNS = "DataFrame, all columns"
DATAFRAME_PATHS = (DATAFRAME, DATAFRAME_SPARK_COUNTS, DATAFRAME_ALL_COLUMNS)


def topic_totals(frame: Any) -> Any:
    """The DataFrame aggregate: messages per topic (SQL expressions: the same on classic and Connect)."""
    return frame.groupBy("topic").count().selectExpr("topic", "`count` AS metric")


@contextlib.contextmanager
def connect_session(master: str, url: str | None) -> Iterator[tuple[Any, dict[str, float]]]:
    """A Spark Connect client session and its start-up times: a local server started here with
    ``master`` (stopped afterwards), or the one at ``url``."""
    from bench.common import warm_up
    from txstore.runner import spark_session

    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        server_seconds = 0.0
        if url is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
            from tests.helpers.spark_connect import SparkConnectServer

            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txstore-bench-")))
            server = stack.enter_context(SparkConnectServer(directory, master=master))
            url = server.url
            server_seconds = server.startup_seconds
        session_started = time.monotonic()
        spark: Any = spark_session("txstore bench (Connect)", remote=url)
        stack.callback(spark.stop)
        session = time.monotonic()
        warm_up(spark)
        warm = time.monotonic()
        yield (
            spark,
            {
                "server_seconds": round(server_seconds, 3),
                "session_seconds": round(session - session_started, 3),
                "python_workers_seconds": round(warm - session, 3),
                "total_seconds": round(warm - started, 3),
            },
        )


class PathRuns:
    """Times one job per path over a workload; checks each stored total."""

    def __init__(self, bootstrap: str, database_url: str, sessions: dict[str, Any]) -> None:
        self.bootstrap = bootstrap
        self.database_url = database_url
        self.sessions = sessions  # "classic" / "Connect" -> SparkSession
        self._jobs = 0

    def paths(self) -> list[tuple[str, str]]:
        return [(s, p) for s in self.sessions for p in (PER_RANGE, *DATAFRAME_PATHS)]

    def run(self, workload: Workload, session: str, path: str) -> dict[str, Any]:
        self._jobs += 1
        name = f"bench-path-{session}-{path}-{self._jobs}".replace(" ", "-")
        settings = JobSettings(name, (workload.topic,), self.bootstrap, self.database_url)
        spark = self.sessions[session]
        if path == PER_RANGE:
            job = TransactionalJob(spark, settings, count_messages)
        else:
            columns = KAFKA_SOURCE_COLUMNS if path == DATAFRAME_ALL_COLUMNS else None
            job = TransactionalJob(
                spark,
                settings,
                dataframe_aggregate=topic_totals,
                read_columns=columns,
                push_down_counts=path == DATAFRAME,
            )
        try:
            job.plan()
            job.check_query()  # once per job, before its first batch (the columns it reads)
            started = time.monotonic()
            report = job.run_batch()
            wall_ms = (time.monotonic() - started) * 1000
        finally:
            job.close()
        if any(r.outcome != COMMITTED for r in report.ranges):
            raise RuntimeError(
                f"{session} {path}: a range was not committed: {[r.outcome for r in report.ranges]}"
            )
        with connect(self.database_url) as conn:
            stored = store.topic_totals(conn, name, [workload.topic]).get(workload.topic)
        if stored != workload.messages:
            raise RuntimeError(f"{session} {path}: stored total {stored}, expected {workload.messages}")
        return {
            "session": session,
            "path": path,
            "messages": workload.messages,
            "wall_ms": wall_ms,
            "plan_ms": report.plan_ms,
            "run_ms": report.run_ms,
            "commit_ms": report.commit_ms,
            "read_ms_sum": sum(r.read_ms for r in report.ranges),
            "messages_per_second": workload.messages / (wall_ms / 1000),
        }

    def compare(self, workload: Workload, rounds: int) -> dict[str, Any]:
        paths = self.paths()
        runs: dict[str, list[dict[str, Any]]] = {_label(s, p): [] for s, p in paths}
        for r in range(rounds):
            shift = r % len(paths)
            for session, path in paths[shift:] + paths[:shift]:
                runs[_label(session, path)].append(self.run(workload, session, path))
        rates = {label: [x["messages_per_second"] for x in xs] for label, xs in runs.items()}
        result: dict[str, Any] = {
            "rounds": rounds,
            "runs": runs,
            "messages_per_second_median": {label: statistics.median(xs) for label, xs in rates.items()},
            "ratios": {},
        }

        def ratio(name: str, a: str, b: str) -> None:
            if a in rates and b in rates:
                per_round = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
                result["ratios"][name] = {"median": statistics.median(per_round), "rounds": per_round}

        for path in DATAFRAME_PATHS:
            ratio(
                f"classic {path} / classic per-range", _label("classic", path), _label("classic", PER_RANGE)
            )
        ratio(
            "Connect per-range / classic per-range",
            _label("Connect", PER_RANGE),
            _label("classic", PER_RANGE),
        )
        for path in DATAFRAME_PATHS:
            ratio(f"Connect {path} / classic {path}", _label("Connect", path), _label("classic", path))
        for path in DATAFRAME_PATHS:
            ratio(
                f"Connect {path} / Connect per-range", _label("Connect", path), _label("Connect", PER_RANGE)
            )
        return result


def _label(session: str, path: str) -> str:
    return f"{session} {path}"

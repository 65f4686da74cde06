"""The benchmark: the job beside the limit, in one run, on the test broker and a real PostgreSQL.

Every target is a ratio of two measurements taken side by side in this run
(timings on a shared 2-core machine are noisy); see ``bench/README``-style
notes in the project README, section "Benchmark".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.broker import BrokerProcess
from bench.common import (
    RESULTS,
    bench_database,
    machine,
    percentile,
    positive_count,
    positive_counts,
    say,
    spark_jobs,
    start_spark,
)
from bench.limit import raw_read
from bench.memory import PeakMemory
from bench.targets import evaluate
from bench.workload import Workload, fit_value_bytes, plan_workload, produce
from txstore.count_topic import count_messages
from txstore.job import BatchReport, JobSettings, TransactionalJob
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import close_idle_consumers
from txstore.postgres.db import redact
from txstore.spark.ranges.range_task import COMMITTED

log = logging.getLogger("bench")


# -- arguments -------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark count_topic against the raw parallel Kafka read rate, in one run.",
    )
    p.add_argument(
        "--messages", type=positive_count, default=2_000_000, help="main workload size (default 2e6)"
    )
    p.add_argument(
        "--partitions", type=positive_count, default=32, help="main workload partitions (default 32)"
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument(
        "--value-bytes",
        type=positive_count,
        default=100,
        help="largest message value to use; each workload uses the largest size up to this that "
        "fits the test broker's 5 MiB per partition (default 100)",
    )
    p.add_argument(
        "--fill",
        type=float,
        default=0.8,
        help="fraction of the test broker's 5 MiB per partition a workload may fill (default 0.8)",
    )
    p.add_argument(
        "--repeats",
        type=positive_count,
        default=7,
        help="side-by-side pairs (limit, job) for the main workload",
    )
    p.add_argument("--producers", type=positive_count, default=2, help="processes producing the workload")
    p.add_argument(
        "--idle-batches", type=positive_count, default=20, help="idle batches to time (default 20)"
    )
    p.add_argument(
        "--trickle-partitions",
        type=positive_counts,
        default=[8, 64],
        help="partition counts for --interval batches with a trickle of messages (default 8,64)",
    )
    p.add_argument(
        "--trickle-messages",
        type=positive_count,
        default=640,
        help="new messages per trickle batch (default 640)",
    )
    p.add_argument(
        "--trickle-rounds", type=positive_count, default=10, help="trickle batches to time (default 10)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="the --interval of trickle batches (s)")
    p.add_argument(
        "--sweep-partitions",
        type=positive_counts,
        default=[1, 8, 64],
        help="partition counts of the sweep (default 1,8,64; empty to skip the sweep)",
    )
    p.add_argument(
        "--sweep-messages",
        type=positive_counts,
        default=[100_000, 1_000_000, 10_000_000],
        help="message counts of the sweep (default 1e5,1e6,1e7); cells that cannot fit the "
        "test broker are skipped and listed",
    )
    p.add_argument(
        "--path-rounds",
        type=positive_count,
        default=5,
        help="rounds of the paths comparison: per-range and DataFrame aggregate, classic and Connect, "
        "over the main workload (default 5)",
    )
    p.add_argument(
        "--no-connect",
        action="store_true",
        help="compare the paths on classic Spark only (no Connect server)",
    )
    p.add_argument(
        "--connect-url",
        metavar="sc://HOST:PORT",
        help="use this Spark Connect server (same master as --master) instead of starting a local one",
    )
    p.add_argument("--name", default="default", help="results name: <output-dir>/<name>.json and .png")
    p.add_argument(
        "--output-dir", type=Path, default=RESULTS, help="where results go (default bench/results)"
    )
    p.add_argument(
        "--database-url",
        help="an existing PostgreSQL database to use (migrated first); by default a throwaway "
        "database is created on the server the libpq variables name (PGHOST, PGPORT, PGUSER, "
        "PGPASSWORD; default postgres@127.0.0.1:5432) and dropped afterwards",
    )
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    return p


# -- measurements ----------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, spark: Any, broker: BrokerProcess, database_url: str):
        self.args = args
        self.spark = spark
        self.broker = broker
        self.bootstrap = broker.bootstrap_servers
        self.database_url = database_url
        self.cores = int(spark.sparkContext.defaultParallelism)
        self.memory = PeakMemory()
        self.commit_ms: list[float] = []
        self._jobs = 0

    def job(self, label: str, topic: str, interval: float | None = None) -> TransactionalJob:
        self._jobs += 1
        settings = JobSettings(
            f"bench-{label}-{self._jobs}", (topic,), self.bootstrap, self.database_url, interval=interval
        )
        return TransactionalJob(self.spark, settings, count_messages)

    def timed_batch(self, job: TransactionalJob, expected: int | None) -> dict[str, Any]:
        """One batch as ``--once`` or one ``--interval`` step runs it, with its breakdown."""
        jobs_before = spark_jobs(self.spark)
        started = time.monotonic()
        report = job.run_batch()
        wall_ms = (time.monotonic() - started) * 1000
        launched = spark_jobs(self.spark) - jobs_before
        if expected is not None and report.messages != expected:
            raise RuntimeError(f"batch counted {report.messages} messages, expected {expected}")
        if any(r.outcome != COMMITTED for r in report.ranges):
            raise RuntimeError(f"a range was not committed: {[r.outcome for r in report.ranges]}")
        self.commit_ms.extend(r.commit_ms for r in report.ranges)
        return batch_record(report, wall_ms, self.cores, launched)

    def limit(self, workload: Workload) -> dict[str, Any]:
        return raw_read(self.bootstrap, workload.topic, workload.counts(), self.cores)

    def new_workload(self, name: str, messages: int, partitions: int, value_bytes: int) -> Workload:
        workload = plan_workload(name, messages, partitions, value_bytes, self.args.fill)
        self.broker.create_topic(workload.topic, partitions)
        seconds = produce(self.bootstrap, workload, self.args.producers)
        log.info("produced %d messages to %s in %.1f s", messages, workload.topic, seconds)
        return workload

    def side_by_side(self, workload: Workload, label: str, first_job: bool) -> dict[str, Any]:
        """The limit and the job over the same messages, one right after the other.

        The job is started first (connection, schema check, its offset rows:
        what a job's first run does once), so the timed batch is a running
        job's batch over a backlog of exactly the workload.
        """
        job = self.job(label, workload.topic)
        try:
            job.plan()
            if not first_job:
                limit = self.limit(workload)
            self.memory.reset()
            batch = self.timed_batch(job, workload.messages)
            batch["memory"] = self.memory.peaks()
            if first_job:
                limit = self.limit(workload)
        finally:
            job.close()
        batch["messages_per_second"] = workload.messages / (batch["wall_ms"] / 1000)
        return {
            "limit": limit,
            "job": batch,
            "ratio": batch["messages_per_second"] / limit["messages_per_second"],
        }

    # -- scenarios ---------------------------------------------------------------
    def main_workload(self) -> dict[str, Any]:
        a = self.args
        say(f"main workload: {a.messages} messages over {a.partitions} partitions")
        workload = self.new_workload("bench-main", a.messages, a.partitions, a.value_bytes)
        pairs = []
        for r in range(a.repeats):
            pair = self.side_by_side(workload, "main", first_job=r % 2 == 1)
            say(
                f"  pair {r + 1}: fastest raw read {pair['limit']['messages_per_second']:,.0f} msg/s "
                f"({pair['limit']['strategy']}), job {pair['job']['messages_per_second']:,.0f} msg/s, "
                f"ratio {pair['ratio']:.2f}"
            )
            pairs.append(pair)
        idle = self.idle_batches(workload)
        self.main_topic = workload  # the paths comparison reads it too; main() deletes it
        # The limit is one raw strategy: the one fastest over all pairs (median).
        # Taking the fastest of four noisy runs in each pair instead would favour
        # the limit by luck; that stricter ratio is reported too.
        medians = {
            s: statistics.median(p["limit"]["strategies"][s]["messages_per_second"] for p in pairs)
            for s in pairs[0]["limit"]["strategies"]
        }
        best = max(medians, key=lambda s: medians[s])
        for p in pairs:
            p["ratio_fastest_in_pair"] = p["ratio"]
            p["ratio"] = (
                p["job"]["messages_per_second"] / p["limit"]["strategies"][best]["messages_per_second"]
            )
        ratios = [p["ratio"] for p in pairs]
        commit_shares = [p["job"]["commit_share"] for p in pairs]
        median_pair = sorted(pairs, key=lambda p: p["ratio"])[len(pairs) // 2]
        return {
            "workload": workload.describe(),
            "pairs": pairs,
            "limit_strategy": best,
            "limit_strategy_medians": medians,
            "ratio_median": statistics.median(ratios),
            "ratio_median_vs_fastest_in_each_pair": statistics.median(
                p["ratio_fastest_in_pair"] for p in pairs
            ),
            "commit_share_median": statistics.median(commit_shares),
            "median_pair": median_pair,
            "idle": idle,
        }

    def idle_batches(self, workload: Workload) -> dict[str, Any]:
        """Batches with nothing new, on a job that has counted everything."""
        job = self.job("idle", workload.topic)
        try:
            self.timed_batch(job, workload.messages)  # catch up first (not timed as idle)
            batches = [self.timed_batch(job, 0) for _ in range(self.args.idle_batches)]
        finally:
            job.close()
        walls = [b["wall_ms"] for b in batches]
        result = {
            "batches": len(batches),
            "wall_ms": walls,
            "p50_ms": statistics.median(walls),
            "max_ms": max(walls),
            "spark_jobs_launched": sum(b["spark_jobs"] for b in batches),
            "plan_ms_p50": statistics.median(b["plan_ms"] for b in batches),
        }
        say(
            f"  idle batch: p50 {result['p50_ms']:.1f} ms, max {result['max_ms']:.1f} ms, "
            f"{result['spark_jobs_launched']} Spark jobs"
        )
        return result

    def trickle(self) -> dict[str, Any]:
        """``--interval`` batches with a few new messages in every partition."""
        a = self.args
        results: dict[str, Any] = {}
        producer = Producer({**client_config(self.bootstrap), "linger.ms": 5})
        for partitions in a.trickle_partitions:
            topic = f"bench-trickle-{partitions}"
            self.broker.create_topic(topic, partitions)
            job = self.job(f"trickle{partitions}", topic, interval=a.interval)
            batches = []
            try:
                self.timed_batch(job, 0)  # the first batch creates the offset rows
                for n in range(a.trickle_rounds):
                    for i in range(a.trickle_messages):
                        producer.produce(topic, b"x" * 32, b"user-%05d" % i, partition=i % partitions)
                    if producer.flush(30):
                        raise RuntimeError("trickle messages were not delivered")
                    batches.append(self.timed_batch(job, a.trickle_messages))
                    log.info("trickle %d partitions round %d: %.0f ms", partitions, n, batches[-1]["wall_ms"])
            finally:
                job.close()
            self.broker.delete_topic(topic)
            walls = [b["wall_ms"] for b in batches]
            results[str(partitions)] = {
                "partitions": partitions,
                "messages_per_batch": a.trickle_messages,
                "wall_ms": walls,
                "p50_ms": statistics.median(walls),
                "p90_ms": percentile(walls, 90),
                "max_ms": max(walls),
                "ranges_per_batch": statistics.median(b["ranges"] for b in batches),
                "median_batch": sorted(batches, key=lambda b: b["wall_ms"])[len(batches) // 2],
            }
            say(
                f"trickle: {partitions} partitions, {a.trickle_messages} new messages: "
                f"p50 {results[str(partitions)]['p50_ms']:.0f} ms, max {max(walls):.0f} ms"
            )
        return results

    def sweep(self) -> dict[str, Any]:
        a = self.args
        cells = [(p, n) for p in a.sweep_partitions for n in a.sweep_messages]
        fits = {(p, n): fit_value_bytes(n, p, a.value_bytes, a.fill) for p, n in cells}
        feasible = [c for c in cells if fits[c] is not None]
        skipped = [
            {"partitions": p, "messages": n, "reason": "does not fit the test broker's 5 MiB per partition"}
            for p, n in cells
            if fits[(p, n)] is None
        ]
        if not feasible:
            return {"value_bytes": None, "cells": [], "skipped": skipped}
        # One value size for every cell, so that only messages and partitions change.
        value_bytes = min(v for v in (fits[c] for c in feasible) if v is not None)
        say(f"sweep: {len(feasible)} cells, {value_bytes}-byte values; skipped {len(skipped)}")
        results = []
        for partitions, messages in sorted(feasible, key=lambda c: (c[1], c[0])):
            workload = self.new_workload(
                f"bench-sweep-{partitions}-{messages}", messages, partitions, value_bytes
            )
            pair = self.side_by_side(workload, f"sweep{partitions}x{messages}", first_job=False)
            self.broker.delete_topic(workload.topic)
            results.append({"workload": workload.describe(), **pair})
            say(
                f"  {messages:>10,} messages / {partitions:>2} partitions: job {pair['job']['wall_ms']:,.0f} ms "
                f"({pair['job']['messages_per_second']:,.0f} msg/s), limit "
                f"{pair['limit']['messages_per_second']:,.0f} msg/s, ratio {pair['ratio']:.2f}, worker peak "
                f"{pair['job']['memory']['python_worker_max_mib']:.0f} MiB"
            )
        return {"value_bytes": value_bytes, "cells": results, "skipped": skipped}


def compare_paths(
    args: argparse.Namespace, spark: Any, broker: BrokerProcess, database_url: str, bench: Bench
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """The main workload counted by each path, classic and (unless ``--no-connect``) Connect."""
    from bench.paths import PathRuns, connect_session

    with contextlib.ExitStack() as stack:
        sessions: dict[str, Any] = {"classic": spark}
        startup = None
        if not args.no_connect:
            say(
                "paths: starting a Spark Connect client"
                + (f" of {args.connect_url}" if args.connect_url else " and a local server")
            )
            sessions["Connect"], startup = stack.enter_context(connect_session(args.master, args.connect_url))
            say(
                f"  Connect: server {startup['server_seconds']:.1f} s, session {startup['session_seconds']:.1f} s, "
                f"first Python workers {startup['python_workers_seconds']:.1f} s (not in any batch)"
            )
        runs = PathRuns(broker.bootstrap_servers, database_url, sessions)
        paths = runs.compare(bench.main_topic, args.path_rounds)
    for label, rate in paths["messages_per_second_median"].items():
        say(f"  {label:36s} {rate:>12,.0f} msg/s (median of {args.path_rounds})")
    for name, ratio in paths["ratios"].items():
        say(f"  {name}: {ratio['median']:.2f}")
    return paths, startup


def batch_record(report: BatchReport, wall_ms: float, cores: int, spark_jobs: int) -> dict[str, Any]:
    """A batch's wall time split into plan / read+aggregate / commit / Spark and the rest.

    Tasks run ``min(cores, ranges)`` at a time, so the summed task times are
    divided by that to put them on the batch's wall clock.
    """
    ranges = report.ranges
    lanes = max(1, min(cores, len(ranges)))
    read_sum = sum(r.read_ms for r in ranges)
    commit_sum = sum(r.commit_ms for r in ranges)
    plan = report.plan_ms
    read = read_sum / lanes
    commit = commit_sum / lanes
    return {
        "messages": report.messages,
        "ranges": len(ranges),
        "wall_ms": wall_ms,
        "plan_ms": plan,
        "run_ms": report.run_ms,
        "read_ms_sum": read_sum,
        "commit_ms_sum": commit_sum,
        "breakdown_ms": {
            "plan": plan,
            "read_aggregate": read,
            "commit": commit,
            "spark_and_other": max(0.0, wall_ms - plan - read - commit),
        },
        "commit_share": commit / wall_ms if wall_ms > 0 else 0.0,
        "spark_jobs": spark_jobs,
    }


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """``python -m bench``; ``spark``: a running session to use (and leave running)."""
    from bench.report import print_table, write_chart, write_json

    args = parser().parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        filename=str(args.output_dir / f"{args.name}.log"),
        filemode="w",
    )
    for noisy in ("py4j", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.monotonic()
    load_before = os.getloadavg()
    with bench_database(args.database_url) as database_url, BrokerProcess() as broker:
        say(f"test broker {broker.bootstrap_servers}, PostgreSQL {redact(database_url)}")
        own_session = spark is None
        spark, startup = start_spark(args.master, spark)
        try:
            bench = Bench(args, spark, broker, database_url)
            say(
                f"Spark {args.master}: {bench.cores} cores; session {startup['session_seconds']:.1f} s, "
                f"first Python workers {startup['python_workers_seconds']:.1f} s (not in any batch)"
            )
            results: dict[str, Any] = {"startup": startup}
            results["main"] = bench.main_workload()
            results["paths"], results["connect_startup"] = compare_paths(
                args, spark, broker, database_url, bench
            )
            broker.delete_topic(bench.main_topic.topic)
            results["trickle"] = bench.trickle()
            results["sweep"] = (
                bench.sweep()
                if args.sweep_partitions and args.sweep_messages
                else {"cells": [], "skipped": []}
            )
            commits = bench.commit_ms
            results["commit_latency_ms"] = {
                "ranges": len(commits),
                "p50": percentile(commits, 50),
                "p99": percentile(commits, 99),
                "max": max(commits, default=float("nan")),
            }
        finally:
            close_idle_consumers()  # the driver's pooled readers, before their broker goes
            if own_session:
                spark.stop()
    document = {
        "name": args.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "database_url"
        },
        "machine": {**machine(), "load_average_at_start": [round(x, 2) for x in load_before]},
        "cores": bench.cores,
        "seconds": round(time.monotonic() - started, 1),
        **results,
    }
    document["targets"] = evaluate(document)
    json_path = write_json(document, args.output_dir / f"{args.name}.json")
    print_table(document)
    chart = None if args.no_chart else write_chart(document, args.output_dir / f"{args.name}.png")
    say(f"wrote {json_path}" + (f" and {chart}" if chart else ""))
    return 0

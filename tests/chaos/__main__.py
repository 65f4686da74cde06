"""python -m tests.chaos --trials N [--seed S] [--connect] [--kafka real] [--stream [--mode M]] | --replay SEED [--faults kind,kind] | --summarize LOG..."""

from __future__ import annotations

import argparse
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.chaos.runner import (
    FAULT_KINDS,
    OPT_IN_FAULT_KINDS,
    REAL_KAFKA_FAULT_KINDS,
    Summary,
    TrialPlan,
    TrialResult,
    environment,
    run_trials,
)
from tests.chaos.stream import StreamPlan, StreamSummary, run_stream_trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Run count_topic under random faults and check that every message is counted "
        "exactly once. Prints one line per trial and a summary line; exits 1 if any trial failed.",
    )
    parser.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    parser.add_argument(
        "--seed", type=int, help="seed of the first trial (default: random); trial i uses seed+i"
    )
    parser.add_argument("--replay", type=int, metavar="SEED", help="run the one trial with this seed")
    parser.add_argument(
        "--faults",
        help="with --replay or a single trial: these fault kinds instead "
        f"({', '.join(FAULT_KINDS + OPT_IN_FAULT_KINDS + REAL_KAFKA_FAULT_KINDS)}; the last "
        f"{len(REAL_KAFKA_FAULT_KINDS)} with --kafka real only)",
    )
    parser.add_argument(
        "--job-args",
        default="",
        metavar="FLAGS",
        help="more count_topic flags for every trial, e.g. '--by key --commit per-batch' "
        "(default: the topic total, committed per range)",
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="run the jobs as Spark Connect clients (--remote) of a local Connect server the run "
        "starts; without the fault kinds that do not apply there (runner.CONNECT_EXCLUDED)",
    )
    parser.add_argument(
        "--kafka",
        choices=("mock", "real"),
        default="mock",
        help="the broker: librdkafka's mock cluster (default) or Apache Kafka (4.1, KRaft; its jars "
        "fetched by Maven once), the jobs' connections through a proxy it advertises, with the "
        "fault kinds of a real broker (runner.REAL_KAFKA_FAULT_KINDS); with --summarize: which "
        "broker's fault kinds the summary lists",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="trials of a Structured Streaming query (tests/chaos/stream_job.py, readStream -> "
        "writeStream.format('txstore')) with the stream's fault kinds (tests/chaos/stream.py); "
        "with --summarize: the stream summary",
    )
    parser.add_argument(
        "--mode",
        choices=("counts", "counted", "table"),
        help="with --stream: every trial in this mode (default: rotating with the seed)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="where failed trials leave their logs (default: a new temp dir, removed if all pass)",
    )
    parser.add_argument("--database-url", help="PostgreSQL admin URL (default: from PGHOST/PGPORT/PGUSER)")
    parser.add_argument(
        "--summarize",
        nargs="+",
        type=Path,
        metavar="LOG",
        help="print the summary line of the trials these earlier runs' outputs report "
        "(a run cut off before its summary, or several runs together); runs nothing",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        summary = summarize(line for log in args.summarize for line in log.read_text().splitlines())
        summary.kafka = args.kafka
        if args.stream:
            summary = StreamSummary(summary.seed, summary.results, args.kafka)
        print(summary.line())
        return 0 if summary.results and not summary.failed else 1
    if args.connect and args.kafka == "real":
        parser.error("--connect runs on the mock broker only (not yet with --kafka real)")
    if args.connect and args.stream:
        parser.error("--stream runs classic Spark queries (not yet --connect)")
    faults = tuple(args.faults.split(",")) if args.faults else None
    if args.replay is not None:
        seeds = [args.replay]
    else:
        first = args.seed if args.seed is not None else random.randrange(1_000_000)
        seeds = [first + i for i in range(args.trials)]
    if args.stream:
        return _main_stream(args, seeds, faults)
    plans = [
        TrialPlan.generate(
            s, faults, job_args=shlex.split(args.job_args), connect=args.connect, kafka=args.kafka
        )
        for s in seeds
    ]
    summary = Summary(seed=seeds[0], kafka=args.kafka)
    return _run(args, plans, summary, run_trials, "txstore-chaos-")


def _main_stream(args: argparse.Namespace, seeds: list[int], faults: tuple[str, ...] | None) -> int:
    plans = [StreamPlan.generate_stream(s, faults, kafka=args.kafka, mode=args.mode) for s in seeds]
    summary = StreamSummary(seed=seeds[0], kafka=args.kafka)
    return _run(args, plans, summary, run_stream_trials, "txstore-chaos-stream-")


def _run(
    args: argparse.Namespace,
    plans: Sequence[Any],
    summary: Any,
    run: Callable[[Any, Any, Callable[[str], None], Any], Any],
    prefix: str,
) -> int:
    """``run(env, plans, log, summary)`` in a fresh environment, then the summary line; 0 when every
    trial ran and passed (its folder then removed unless --keep)."""
    started = time.monotonic()

    def log(line: str) -> None:
        print(line, flush=True)

    # Ctrl-C or SIGTERM: finish with the summary of the trials done (and clean up).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    directory = args.keep or Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with environment(args.database_url, directory, kafka=args.kafka) as env:
            run(env, plans, log, summary)
    except KeyboardInterrupt:
        log("interrupted; summary of the trials that finished:")
    log(f"{summary.line()}; {time.monotonic() - started:.0f}s")
    passed = not summary.failed and len(summary.results) == len(plans)
    if passed and args.keep is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if passed else 1


TRIAL_LINE = re.compile(
    r"trial seed (?P<seed>\d+): (?P<status>ok|FAILED: .*?); injected (?P<injected>.*?); "
    r"produced (?P<produced>\d+), counted (?P<counted>\d+), lost (?P<lost>\d+), "
    r"duplicated (?P<duplicated>\d+); (?P<events>.*); (?P<seconds>\d+)s$"
)


FAILED_START = re.compile(r"trial seed \d+: FAILED: ")
MAX_CONTINUATION_LINES = 200


def summarize(lines: Iterable[str]) -> Summary:
    """The summary of the trials whose result lines (:meth:`TrialResult.line`) are given."""
    summary = Summary()
    pending = ""  # a failed trial's line that an older runner broke over several lines
    for line in lines:
        if pending:
            line = pending = pending + " / " + line.strip()
            if pending.count(" / ") > MAX_CONTINUATION_LINES:
                pending = ""
        m = TRIAL_LINE.search(line)
        if m is None:
            if not pending and FAILED_START.search(line):
                pending = line.rstrip("\n")
            continue
        pending = ""
        seed = int(m["seed"])
        result = TrialResult(
            TrialPlan.generate(seed),
            produced=int(m["produced"]),
            counted=int(m["counted"]),
            lost=int(m["lost"]),
            duplicated=int(m["duplicated"]),
            seconds=float(m["seconds"]),
        )
        result.injected.update(_counts(m["injected"]))
        result.events.update(_counts(m["events"]))
        if m["status"] != "ok":
            result.failures.append(m["status"].removeprefix("FAILED: "))
        summary.seed = seed if summary.seed is None else min(summary.seed, seed)
        summary.add(result)
    return summary


def _counts(text: str) -> dict[str, int]:
    pairs = (item.split("=", 1) for item in text.split() if "=" in item)
    return {k: int(v) for k, v in pairs}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

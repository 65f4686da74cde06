"""python -m tests.chaos --trials N [--seed S] | --replay SEED [--faults kind,kind]"""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.runner import FAULT_KINDS, Summary, TrialPlan, environment, run_trials


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
        help=f"with --replay or a single trial: these fault kinds instead ({', '.join(FAULT_KINDS)})",
    )
    parser.add_argument(
        "--job-args",
        default="",
        metavar="FLAGS",
        help="more count_topic flags for every trial, e.g. '--by key --commit per-batch' "
        "(default: the topic total, committed per range)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="where failed trials leave their logs (default: a new temp dir, removed if all pass)",
    )
    parser.add_argument("--database-url", help="PostgreSQL admin URL (default: from PGHOST/PGPORT/PGUSER)")
    args = parser.parse_args(argv)
    faults = tuple(args.faults.split(",")) if args.faults else None
    if args.replay is not None:
        seeds = [args.replay]
    else:
        first = args.seed if args.seed is not None else random.randrange(1_000_000)
        seeds = [first + i for i in range(args.trials)]
    plans = [TrialPlan.generate(s, faults, job_args=shlex.split(args.job_args)) for s in seeds]
    summary = Summary(seed=seeds[0])
    started = time.monotonic()

    def log(line: str) -> None:
        print(line, flush=True)

    # Ctrl-C or SIGTERM: finish with the summary of the trials done (and clean up).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    directory = args.keep or Path(tempfile.mkdtemp(prefix="txstore-chaos-"))
    try:
        with environment(args.database_url, directory) as env:
            run_trials(env, plans, log, summary)
    except KeyboardInterrupt:
        log("interrupted; summary of the trials that finished:")
    log(f"{summary.line()}; {time.monotonic() - started:.0f}s")
    passed = not summary.failed and len(summary.results) == len(plans)
    if passed and args.keep is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if passed else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

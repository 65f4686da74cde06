"""Running a job from the command line: logging, SparkSession, exit codes.

Any failure exits non-zero with one line on stderr; ``--verbose`` adds the
traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from txstore.errors import TxstoreError, first_line
from txstore.job import JobSettings, TransactionalJob, stop_on_signals
from txstore.options import add_job_options, job_settings
from txstore.task import Aggregate

log = logging.getLogger("txstore")


def configure_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "alembic", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def spark_session(app_name: str) -> object:
    """The SparkSession: spark-submit's ``--master``, else Spark's default ``local[*]``."""
    # Workers must run this interpreter, which has txstore's dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false").getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def run_job_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    default_job: str,
    aggregate: Aggregate,
    add_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Parse the shared options, run the job, and turn any failure into one line."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_job_options(parser, default_job)
    if add_options:
        add_options(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        settings: JobSettings = job_settings(args)
        spark = spark_session(f"txstore {settings.job}")
        stop = stop_on_signals()
        TransactionalJob(spark, settings, aggregate).run(stop)
        return 0
    except TxstoreError as e:
        if args.verbose:
            log.exception("failed")
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.verbose:
            log.exception("failed")
        print(
            f"{prog}: error: {type(e).__name__}: {first_line(e)[:500]} (rerun with --verbose for a traceback)",
            file=sys.stderr,
        )
        return 1

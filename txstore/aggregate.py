"""aggregate: Spark SQL over each batch, merged exactly once into a table of your own.

    spark-submit jobs/aggregate.py --topic orders --table sales_by_country --key country \\
        --merge revenue=sum,orders=sum,largest=max,first_seen=min \\
        --sql "SELECT ... FROM batch GROUP BY ..."

``--sql`` (or ``--sql-file``) runs over a view named ``batch`` holding the
batch's messages with the columns of Spark's Kafka source (``key``,
``value``, ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType``, ``headers``), or only those ``--read-columns`` names
(only they are built and handed to Spark: a query over keys and timestamps
then never pays for values and headers); by default only those the
query's optimized plan uses (:mod:`txstore.spark.source.used_columns`); a query that is only
counts grouped by Kafka-source columns is counted in part by the reading tasks
(:mod:`txstore.spark.source.pushdown`; ``--no-push-down-counts``). Its output columns are the table's
``--key`` columns and the columns named in ``--merge``, nothing else; each
batch's rows are merged into the table by their rules in the transaction
that moves the offsets (:mod:`txstore.modes.results_table`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstore.core.errors import ResultsTableInvalid
from txstore.postgres.results.results_table import MERGE_RULES, parse_results_table
from txstore.runner import run_job_main
from txstore.spark.source.source_columns import ColumnsInvalid, check_columns

VIEW = "batch"
"""The temporary view the query reads: the batch's messages."""


@dataclass(frozen=True)
class SqlAggregate:
    """A DataFrame aggregate that is a Spark SQL query over the view ``batch``."""

    query: str

    def __call__(self, frame: Any) -> Any:
        frame.createOrReplaceTempView(VIEW)
        return frame.sparkSession.sql(self.query)


def add_aggregate_options(parser: argparse.ArgumentParser) -> None:
    query = parser.add_mutually_exclusive_group(required=True)
    query.add_argument(
        "--sql",
        metavar="QUERY",
        help=f"Spark SQL over the view {VIEW!r} (the batch's messages, Spark Kafka-source columns); "
        "its columns are the --key columns and the --merge columns",
    )
    query.add_argument("--sql-file", metavar="PATH", help="read the query from this file instead")
    parser.add_argument(
        "--read-columns",
        metavar="COL[,COL...]",
        help=f"only these Kafka-source columns in the view {VIEW!r} (default: those the query's "
        "optimized plan uses, or all when the plan cannot tell); the query is checked against them "
        "before anything is read",
    )
    parser.add_argument(
        "--no-push-down-counts",
        dest="push_down_counts",
        action="store_false",
        help="run the query as written even when it is only counts grouped by Kafka-source columns "
        "(by default those are counted per group by the tasks that read the messages, and Spark "
        "sums the counts)",
    )
    parser.add_argument(
        "--table",
        required=True,
        metavar="[SCHEMA.]NAME",
        help="the existing PostgreSQL table to merge into (txstore never creates or alters it)",
    )
    parser.add_argument(
        "--key",
        required=True,
        metavar="COL[,COL...]",
        help="the columns identifying a row: exactly the table's primary key or a unique constraint",
    )
    parser.add_argument(
        "--merge",
        required=True,
        metavar="COL=RULE[,...]",
        help=f"how each other column of the query merges with the stored value: {', '.join(MERGE_RULES)}",
    )


def results_job_options(args: argparse.Namespace) -> Mapping[str, Any]:
    """The parsed flags as :class:`~txstore.job.TransactionalJob` arguments."""
    query, source = args.sql, "--sql"
    if args.sql_file is not None:
        source = f"--sql-file {args.sql_file}"
        try:
            query = Path(args.sql_file).read_text()
        except OSError as e:  # a usage error like the others here: exit 2, nothing read
            raise ResultsTableInvalid([f"{source}: cannot read it ({e.strerror})"]) from None
    if not query or not query.strip():
        raise ResultsTableInvalid([f"{source}: the query is empty"])
    try:
        table = parse_results_table(args.table, args.key, args.merge)
    except ValueError as e:
        raise ResultsTableInvalid([str(e)]) from None
    options: dict[str, Any] = {
        "dataframe_aggregate": SqlAggregate(query.strip().rstrip(";")),
        "results_table": table,
    }
    if not args.push_down_counts:
        options["push_down_counts"] = False
    if args.read_columns is not None:
        columns = tuple(c.strip() for c in args.read_columns.split(",") if c.strip())
        try:
            options["read_columns"] = check_columns(columns, "--read-columns")
        except ColumnsInvalid as e:
            raise ResultsTableInvalid([str(e)]) from None
    return options


def main(argv: list[str] | None = None) -> int:
    return run_job_main(
        argv,
        prog="aggregate",
        description="Run Spark SQL over each batch of Kafka messages and merge its rows into your own "
        "PostgreSQL table, exactly once.",
        default_job="aggregate",
        add_options=add_aggregate_options,
        make_job_options=results_job_options,
    )


if __name__ == "__main__":
    sys.exit(main())

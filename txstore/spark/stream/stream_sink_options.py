"""``writeStream.format("txstore")``'s options, checked when the query starts.

:func:`parse_sink_options` turns the sink's options (and ``TXSTORE_DATABASE_URL``) into a frozen
:class:`SinkOptions`, refusing in one line what it cannot take: an unknown option, no job, no
database, a results table named in part, a bad ``txstore.onBadMessage``, or ``skip`` without a
table (counting refuses no message). A results table's columns and privileges are checked against
the query and the database when the writer is made
(:func:`~txstore.spark.stream.stream_sink.check_table_query`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from txstore.core.errors import ConfigError, ResultsTableInvalid
from txstore.core.failpoints import FailPoints
from txstore.kafka.bad_messages import FAIL, ON_BAD_MESSAGE, SKIP
from txstore.postgres.db import DATABASE_URL_ENV, resolve_database_url
from txstore.postgres.results.results_table import ResultsTable, parse_results_table


@dataclass(frozen=True)
class SinkOptions:
    """``writeStream.format("txstore")``'s options, checked (:func:`parse_sink_options`)."""

    job: str
    database_url: str
    failpoints: str = ""  # tests: txstore.core.failpoints, as TXSTORE_FAILPOINTS (txstore.core.failpoints)
    table: ResultsTable | None = None  # txstore.table/key/merge: merge the rows into it; None: count
    on_bad_message: str = FAIL  # txstore.onBadMessage: a row the table refuses stops the query, or skip


_TABLE_OPTIONS = ("txstore.table", "txstore.key", "txstore.merge")


def parse_sink_options(options: Mapping[str, str], environ: Mapping[str, str]) -> SinkOptions:
    """The sink's options (names in any case; the database from ``environ``'s
    ``TXSTORE_DATABASE_URL`` when not given), or :class:`~txstore.core.errors.ConfigError`
    naming the first one wrong."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    known = {
        "txstore.job",
        "txstore.databaseurl",
        "txstore.failpoints",
        "txstore.onbadmessage",
        "checkpointlocation",
        "path",
    }
    unknown = sorted(set(given) - known - set(_TABLE_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} for writeStream.format('txstore'); it takes txstore.job, "
            "txstore.databaseUrl, and txstore.table, txstore.key, txstore.merge and txstore.onBadMessage"
        )
    job = given.get("txstore.job", "").strip()
    if not job:
        raise ConfigError("option txstore.job is required by writeStream.format('txstore')")
    url = given.get("txstore.databaseurl") or environ.get(DATABASE_URL_ENV)
    if not url:
        raise ConfigError(
            f"writeStream.format('txstore') needs the job's database: .option('txstore.databaseUrl', "
            f"'postgresql://...') or {DATABASE_URL_ENV} on the driver"
        )
    failpoints = given.get("txstore.failpoints", "")
    FailPoints.parse(failpoints)  # a bad one fails at start()
    table = None
    if any(name in given for name in _TABLE_OPTIONS):
        missing = [name for name in _TABLE_OPTIONS if not given.get(name, "").strip()]
        if missing:
            raise ConfigError(
                f"writeStream.format('txstore') merging into a results table needs {', '.join(missing)} "
                "too: .option('txstore.table', '[schema.]name').option('txstore.key', 'COL[,COL...]')"
                ".option('txstore.merge', 'COL=RULE[,...]')"
            )
        try:
            table = parse_results_table(given["txstore.table"], given["txstore.key"], given["txstore.merge"])
        except ValueError as e:
            raise ConfigError(str(e).replace("--", "txstore.", 1)) from None
        if problems := table.problems():
            raise ResultsTableInvalid(problems)
    on_bad_message = given.get("txstore.onbadmessage", FAIL).strip().lower()
    if on_bad_message not in ON_BAD_MESSAGE:
        raise ConfigError(
            f"option txstore.onBadMessage must be {' or '.join(ON_BAD_MESSAGE)}, got "
            f"{given['txstore.onbadmessage']!r}"
        )
    if on_bad_message == SKIP and table is None:
        raise ConfigError(
            f"job {job}: txstore.onBadMessage skip needs txstore.table: it skips the messages whose rows "
            "a results table refuses, and counting messages refuses none"
        )
    return SinkOptions(job, resolve_database_url(url), failpoints, table, on_bad_message)

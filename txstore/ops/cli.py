"""The ``txstore`` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

EXIT_BROKEN_PIPE = 141
"""Exit status when whoever reads the output stopped reading (``txstore status | head``): a
shell's for a command ended by SIGPIPE (128 + 13), with no traceback."""


def main(argv: list[str] | None = None) -> int:
    """Run the command; output into a pipe its reader closed ends quietly with
    :data:`EXIT_BROKEN_PIPE`."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a broken pipe would print a traceback
        return code
    except BrokenPipeError:
        # Python's documented way: nothing more may reach the closed pipe, not even at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line (no usage above it), with the closest
    command or option when the word given is a near miss, and where to look next."""

    def error(self, message: str) -> NoReturn:
        near = _near_miss(self, message)
        hint = f"; did you mean {near!r}?" if near else ""
        self.exit(2, f"{self.prog}: error: {message}{hint} (see `{self.prog} --help`)\n")


def _near_miss(parser: argparse.ArgumentParser, message: str) -> str | None:
    """The command, choice or option closest to the one ``message`` refuses, if any is close."""
    import difflib
    import re

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
        given, candidates = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
    else:
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if not unknown:
            return None
        given, candidates = unknown.group(1).split("=")[0], sorted(_option_strings(parser))
    close = difflib.get_close_matches(given, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of ``parser`` and its subcommands (argparse reports a subcommand's unknown
    option from the top parser)."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def _main(argv: list[str] | None = None) -> int:
    from txstore import __version__
    from txstore.options import add_check_options, add_connection_options, add_verbose_option

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="txstore", description="Exactly-once Kafka aggregation with Spark.")
    parser.add_argument("--version", action="version", version=f"txstore {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser(
        "count-topic", help="run the count_topic job (same flags as jobs/count_topic.py)", add_help=False
    )
    demo = commands.add_parser("demo", help="run count_topic end to end on an embedded broker and database")
    demo.add_argument("--messages", type=int, default=20_000)
    demo.add_argument("--partitions", type=int, default=4)
    demo.add_argument(
        "--kafka",
        choices=("mock", "real"),
        default="mock",
        help="the broker: librdkafka's mock cluster (default), or Apache Kafka started from its jars "
        "(fetched once with Maven)",
    )
    add_verbose_option(demo)
    pyfiles = commands.add_parser("py-files", help="build the zip for spark-submit --py-files")
    pyfiles.add_argument("--output", type=Path, default=Path("txstore-pyfiles.zip"))
    job_file_command = commands.add_parser(
        "job-file", help="print the path of a job's file in the installed package, for spark-submit"
    )
    job_file_command.add_argument("job", choices=JOB_NAMES, help="the job")
    _add_db_commands(commands)
    commands.add_parser("mock-kafka", help="serve a Kafka-protocol mock broker until stopped", add_help=False)

    status = commands.add_parser(
        "status",
        help="offsets, log offsets, lag, last commit, running state and messages skipped as bad, per partition",
    )
    add_connection_options(status)
    status.add_argument("--job", help="only this job")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    add_check_options(status)
    jobs = commands.add_parser("jobs", help="the jobs in the database with their topics and totals")
    add_connection_options(jobs)
    jobs.add_argument("--json", action="store_true", help="machine-readable output")
    reset = commands.add_parser(
        "reset", help="move a job's stored offsets (prints the plan; changes nothing without --execute)"
    )
    add_connection_options(reset)
    reset.add_argument("--job", required=True)
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partition", type=int, action="append", help="only this partition; repeatable")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log-start offset")
    target.add_argument("--to-latest", action="store_true", help="the log-end offset (skip the backlog)")
    target.add_argument("--to-offset", type=int, metavar="N")
    target.add_argument(
        "--to-datetime", metavar="TIME", help="first message at or after TIME (ISO-8601 or epoch ms)"
    )
    target.add_argument(
        "--shift-by", type=int, metavar="N", help="move by N (negative: back), clamped to the log"
    )
    target.add_argument(
        "--forget",
        action="store_true",
        help="delete the rows of partitions Kafka no longer has (those it still has need --force)",
    )
    reset.add_argument(
        "--new-generation",
        action="store_true",
        help="the topic was deleted and recreated: start a new generation even if that is not detected",
    )
    reset.add_argument(
        "--new-job",
        action="store_true",
        help="the job has not run yet: store offsets for a job name the database does not know "
        "(without it, an unknown --job is refused as a typo)",
    )
    reset.add_argument("--execute", action="store_true", help="apply the plan (refused while the job runs)")
    reset.add_argument(
        "--force",
        action="store_true",
        help="apply a plan the dry run warns about: --forget of partitions Kafka still has (or without "
        "Kafka to ask; the job reads them again), or --to-datetime skipping messages where Kafka cannot "
        "answer time lookups",
    )
    publish = commands.add_parser(
        "publish", help="send a job's committed results still waiting in txn_outbox to Kafka"
    )
    add_connection_options(publish)
    publish.add_argument("--job", required=True)
    publish.add_argument(
        "--retry-failed",
        action="store_true",
        help="first put back in line the results set aside because Kafka refused them for good "
        "(too large on its own, topic missing, not authorized), once the cause is fixed",
    )

    if argv and argv[0] == "count-topic":
        from txstore.count_topic import main as count_topic

        return count_topic(argv[1:])
    if argv and argv[0] == "mock-kafka":
        from txstore.testing.mock_kafka import main as mock_kafka

        return mock_kafka(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "py-files":
        from txstore.spark.runtime.pyfiles import build_py_files

        print(build_py_files(args.output))
        return 0
    if args.command == "job-file":
        from txstore.jobs import job_file

        print(job_file(args.job))
        return 0
    from txstore.core.errors import TxstoreError

    # One handler for every command that can stop on a named error: one line, exit 1, no traceback.
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "db":
            return _db(args)
        return _operate(args)
    except TxstoreError as e:
        if args.command == "status" and args.check:
            return _cannot_check(str(e), args.json)
        print(f"txstore: error: {e}", file=sys.stderr)
        return 1


JOB_NAMES = ("count_topic", "aggregate")
"""The jobs the package ships as files (:mod:`txstore.jobs`)."""


def _add_db_commands(commands: Any) -> None:
    """``txstore db upgrade|downgrade|current``: the revisions this txstore ships, as Alembic runs them."""
    db = commands.add_parser(
        "db", help="create, upgrade or downgrade the txstore tables (the Alembic revisions in the package)"
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = actions.add_parser("upgrade", help="create the txstore tables or upgrade them to REVISION")
    up.add_argument("revision", nargs="?", default="head", metavar="REVISION", help="default: head")
    up.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL instead of running it, for a DBA; needs no database (REVISION may be FROM:TO)",
    )
    down = actions.add_parser(
        "downgrade", help="undo the revisions after REVISION (base: drop every txstore table)"
    )
    down.add_argument("revision", metavar="REVISION")
    current = actions.add_parser("current", help="the database's revision and the one this txstore needs")
    for action in (up, down, current):
        action.add_argument(
            "--database-url",
            help="PostgreSQL URL, postgresql://user:password@host:5432/db (env TXSTORE_DATABASE_URL)",
        )


def _db(args: argparse.Namespace) -> int:
    """``txstore db ...``: one line of outcome, or one line of error (raised as a TxstoreError)."""
    from txstore.postgres import migrate
    from txstore.postgres.db import connect, redact, resolve_database_url

    if args.db_command == "upgrade" and args.sql:
        with migrate.one_line_errors(f"rendering the SQL up to {args.revision}"):
            migrate.offline_sql(args.revision, sys.stdout)
        return 0
    url = resolve_database_url(args.database_url)
    with connect(url) as conn:
        before = migrate.current_revision(conn)
    head, needed = migrate.head_revision(), migrate.SCHEMA_REVISION

    def named(revision: str | None) -> str:
        if revision is None:
            return "none (no txstore tables)"
        return f"{revision} (head)" if revision == head else revision

    if args.db_command == "current":
        print(f"{redact(url)}: revision {named(before)}; this txstore needs {needed}")
        if before != needed:
            print(f"run `{migrate.UPGRADE_COMMAND}` to bring it there")
        return 0
    if args.db_command == "upgrade":
        with migrate.one_line_errors(f"upgrading {redact(url)}"):
            migrate.upgrade(url, args.revision)
    else:
        with migrate.one_line_errors(f"downgrading {redact(url)}"):
            migrate.downgrade(url, args.revision)
    with connect(url) as conn:
        after = migrate.current_revision(conn)
    if after == before:
        print(f"{redact(url)}: already at revision {named(after)}; nothing to do")
    else:
        verb = "upgraded" if args.db_command == "upgrade" else "downgraded"
        print(f"{verb} {redact(url)} from revision {named(before)} to {named(after)}")
    if after != needed:
        print(
            f"txstore: warning: this txstore needs revision {needed}; its jobs refuse to run until "
            f"`{migrate.UPGRADE_COMMAND}`",
            file=sys.stderr,
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``txstore demo``: the quickstart, with the job's log lines as a job logs them."""
    from txstore.ops.demo import run_demo
    from txstore.runner import configure_logging

    configure_logging(args.verbose)
    return run_demo(args.messages, args.partitions, args.kafka, verbose=args.verbose)


def _cannot_check(reason: str, as_json: bool) -> int:
    """``status --check`` could not check (no database, no schema, a bad flag): UNKNOWN, exit 3,
    as Nagios plugins do, with the reason on the line (stdout, where the check's lines go)."""
    import json

    from txstore.core.health import EXIT_UNKNOWN, LEVELS

    line = f"{LEVELS[EXIT_UNKNOWN]}: {reason}"
    if as_json:
        found = {"status": LEVELS[EXIT_UNKNOWN], "exit_code": EXIT_UNKNOWN, "summary": line, "partitions": []}
        print(json.dumps(found, indent=2))
    else:
        print(line)
    return EXIT_UNKNOWN


def _operate(args: argparse.Namespace) -> int:
    from txstore.core.errors import ConfigError
    from txstore.core.starting import parse_timestamp
    from txstore.kafka.client import BOOTSTRAP_ENV
    from txstore.kafka.client_settings import client_config, topic_name_problem
    from txstore.ops import reset
    from txstore.ops import status as ops
    from txstore.ops.reset_plan import ResetTarget, blind_skip_problem, live_forget_problem
    from txstore.postgres.db import connect, resolve_database_url
    from txstore.postgres.migrate import check_schema

    url = resolve_database_url(args.database_url)
    problem = topic_name_problem(args.topic) if args.command == "reset" else None
    if problem:
        raise ConfigError(f"--topic {problem}")
    kafka_conf = (
        client_config(args.bootstrap_servers, dict(args.kafka_options)) if args.bootstrap_servers else None
    )
    with connect(url) as conn:
        check_schema(conn, url)
        if args.command == "status" and args.check:
            return _check(conn, kafka_conf, args)
        if args.command == "status":
            unknown = ops.unknown_job_problem(conn, args.job) if args.job is not None else None
            if unknown:
                raise ConfigError(f"{unknown}; check --job")
            rows, problem = ops.status(conn, kafka_conf, args.job)
            print(ops.as_json(rows) if args.json else ops.format_status(rows))
            outbox = ops.outbox_status(conn, args.job)
            if outbox and not args.json:
                print(f"\n{ops.format_outbox(outbox)}")
            if problem:
                print(f"txstore: warning: {problem}", file=sys.stderr)
            for o in outbox:
                if o.set_aside:
                    print(f"txstore: warning: {o.warning()}", file=sys.stderr)
            return 0
        if args.command == "jobs":
            summaries = ops.jobs(conn)
            print(ops.as_json(summaries) if args.json else ops.format_jobs(summaries))
            return 0
        if args.command == "publish":
            from txstore.kafka.producers import close_producers
            from txstore.postgres.outbox import OutboxPublisher, outbox_counts

            unknown = ops.unknown_job_problem(conn, args.job)
            if unknown:
                raise ConfigError(f"{unknown}; check --job")
            if kafka_conf is None:
                raise ConfigError(f"no Kafka given: pass --bootstrap-servers or set {BOOTSTRAP_ENV}")
            try:
                sent = OutboxPublisher(kafka_conf, args.job).publish_pending(conn, args.retry_failed)
            finally:
                close_producers()
            pending, set_aside = outbox_counts(conn, args.job)
            print(f"published {sent} results of job {args.job!r}; {pending} waiting, {set_aside} set aside")
            if set_aside:
                print(
                    f"txstore: warning: {ops.OutboxStatus(args.job, pending, set_aside).warning()}",
                    file=sys.stderr,
                )
            return 0
        unknown = None if args.new_job else ops.unknown_job_problem(conn, args.job)
        if unknown:
            raise ConfigError(
                f"{unknown}; check --job, or add --new-job to store offsets for a job that has not run yet"
            )
        if args.to_earliest:
            target = ResetTarget("earliest")
        elif args.to_latest:
            target = ResetTarget("latest")
        elif args.to_offset is not None:
            target = ResetTarget("offset", args.to_offset)
        elif args.to_datetime is not None:
            target = ResetTarget("datetime", parse_timestamp(args.to_datetime, "--to-datetime"))
        elif args.shift_by is not None:
            target = ResetTarget("shift", args.shift_by)
        else:
            target = ResetTarget("forget")
        moves = reset.plan_job_reset(
            conn, kafka_conf, args.job, args.topic, args.partition, target, args.new_generation
        )
        blind = None if kafka_conf is None else blind_skip_problem(kafka_conf["bootstrap.servers"], moves)
        if blind and args.execute and not args.force:
            raise ConfigError(f"{blind}; nothing was changed: use --to-offset, or add --force to skip them")
        live = live_forget_problem(args.topic, moves)
        if live and args.execute and not args.force:
            raise ConfigError(
                f"{live}; nothing was changed: --forget is for partitions Kafka no longer has; "
                "add --force to forget these anyway"
            )
        print(f"reset of job {args.job!r}, topic {args.topic!r}:")
        for move in moves:
            print(f"  {move.describe()}")
        for problem in (blind, live):
            if problem and not args.force:
                print(f"txstore: warning: {problem}; --execute needs --force", file=sys.stderr)
        if not args.execute:
            print("dry run: nothing was changed; add --execute to apply this plan")
            return 0
        reset.apply_reset(conn, args.job, moves)
        print("applied")
        return 0


def _check(conn: Any, kafka_conf: dict[str, Any] | None, args: argparse.Namespace) -> int:
    """``status --check``: the summary line and one line per problem (or the same as JSON)."""
    import json
    from datetime import timedelta

    from txstore.core import health
    from txstore.ops import status as ops
    from txstore.ops.health_facts import health_facts

    stall_after = health.STALL_AFTER if args.stall_after is None else timedelta(seconds=args.stall_after)
    facts, now = health_facts(conn, kafka_conf, args.job, stall_after)
    results = [health.evaluate(f, now, stall_after) for f in facts]
    unknown = ops.unknown_job_problem(conn, args.job) if args.job is not None and not facts else None
    if args.json:
        print(
            json.dumps(health.as_json(results, args.job, unknown), default=lambda v: v.isoformat(), indent=2)
        )
    else:
        print(health.format_check(results, args.job, unknown))
    return health.exit_code(results, unknown)


if __name__ == "__main__":
    sys.exit(main())

"""Running a job from the command line: logging, SparkSession, exit codes.

Any failure exits non-zero with one line on stderr; ``--verbose`` adds the
traceback.

Signals: SIGTERM or a first Ctrl-C lets the current batch finish
(:func:`txstore.job.stop_on_signals`). A second Ctrl-C means "stop now"
(:class:`StopNow`): the processes this one started (Spark's JVM, which
ignores SIGINT, and its Python workers) are killed at once, whatever Spark is
doing (starting, or running a batch), logging is silenced so that nothing
torn down mid-call prints a traceback, one line says so and the exit status
is 130. What was committed stays exact: a task killed before its COMMIT
commits nothing, and the next run reads the offsets from the database.

Spark starts in a thread of its own (:func:`start_spark`), so these handlers hold from the
first moment to the last (PySpark installs its own SIGINT handler only from the main thread),
a Spark Connect server that does not answer ends the job in bounded time (``--connect-timeout``),
and a start-up that fails says its cause in one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from txstore.core.errors import (
    MetricsPortInUse,
    ResultsTableInvalid,
    SparkStartAbandoned,
    SparkStartFailed,
    TxstoreError,
    first_line,
)
from txstore.core.failpoints import FailPoints
from txstore.job import IDEMPOTENT, JobSettings, TransactionalJob, stop_on_signals
from txstore.options import CONNECT_TIMEOUT, SPARK_REMOTE_ENV, add_job_options, job_settings
from txstore.report.logformat import TEXT, formatter
from txstore.spark.ranges.range_task import Aggregate
from txstore.spark.runtime.quiet import quiet_driver_launch
from txstore.spark.runtime.startup import (
    connect_address,
    java_cause,
    shown_address,
    unreachable,
    unreachable_master,
)

log = logging.getLogger("txstore")

INTERRUPTED_NOW = "interrupted (second Ctrl-C): Spark stopped"


def descendants(pid: int) -> list[int]:
    """The living processes under ``pid``, parents before their children (from /proc; [] if none
    or no /proc)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: list[int] = []
    level = [pid]
    while level:
        level = [child for child, parent in parents.items() if parent in level and child not in found]
        found.extend(level)
    return found


def kill_children() -> None:
    """SIGKILL every process this one started, and theirs (the JVM first, then its workers)."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


class StopNow:
    """The second Ctrl-C ("stop now") on top of :func:`~txstore.job.stop_on_signals`.

    :meth:`install` wraps the SIGINT handler that function installed: while ``stop`` is
    not set, that handler runs (a first Ctrl-C lets the batch finish). Once it is set, a
    Ctrl-C kills Spark's processes, silences logging and raises ``KeyboardInterrupt``;
    ``requested`` stays true, so whatever the torn-down Py4J connection raises afterwards is
    still an interruption (exit 130), and no new Spark session is started on the way out.
    """

    def __init__(self) -> None:
        self.requested = False

    def now(self) -> None:
        if not self.requested:
            self.requested = True
            logging.disable(logging.CRITICAL)
        kill_children()

    def install(self, stop: threading.Event) -> None:
        job_handler = signal.getsignal(signal.SIGINT)

        def handle(signum: int, frame: Any) -> None:
            if self.requested:
                return  # already stopping now: let the way out finish
            if stop.is_set():
                self.now()
                raise KeyboardInterrupt
            if callable(job_handler):
                job_handler(signum, frame)

        signal.signal(signal.SIGINT, handle)


def configure_logging(verbose: bool = False, log_format: str = TEXT) -> None:
    """Log to stderr as text lines, or with ``log_format="json"`` one JSON object per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for noisy in ("py4j", "alembic", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # librdkafka repeats a failing connection many times a second; the error that
    # ends the run already says what the broker said, so its own lines are for --verbose.
    logging.getLogger("txstore.kafka.client").setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def spark_session(
    app_name: str, remote: str | None = None, ship_txstore: bool = True, quiet: bool = True
) -> object:
    """The SparkSession: classic (spark-submit's ``--master``, else ``local[*]``), or with
    ``remote`` (``sc://host:port``) a Spark Connect client.

    Under Connect there is no ``--py-files``: txstore's sources (the
    ``txstore py-files`` zip, built in a temporary directory) are added to
    the session as an artifact instead, unless ``ship_txstore`` is False.

    ``quiet``: a driver JVM started here logs Spark's errors only (:mod:`txstore.spark.runtime.quiet`),
    and the session's log level is ERROR; else Spark's defaults, and WARN (``--verbose``).
    """
    if remote:
        return _connect_session(app_name, remote, ship_txstore)
    # Workers must run this interpreter, which has txstore's dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    conf = SparkConf().setAppName(app_name).set("spark.ui.showConsoleProgress", "false")
    if quiet:
        quiet_driver_launch()
    # The JVM first (launched with these settings, or spark-submit's): its master, if standalone,
    # must answer, else Spark would retry it for minutes and fail without naming it.
    SparkContext._ensure_initialized(conf=conf)
    master = SparkConf().get("spark.master", None) or ""
    problem = unreachable_master(master)
    if problem is not None:
        raise SparkStartFailed(
            f"Spark did not start: the master {master} cannot be reached: {problem}; start it, "
            "or correct the master's address (spark-submit --master)"
        )
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    # Classic only: the log level is the driver JVM's; a Connect client has no sparkContext,
    # and the server's log level is the server's to set (its log4j2 configuration).
    session.sparkContext.setLogLevel("ERROR" if quiet else "WARN")
    add_wheels_for_executors(session)
    return session


def add_wheels_for_executors(spark: Any) -> list[str]:
    """Put each wheel given to ``spark-submit --py-files`` on the executors' path too; the names
    of the ``.zip`` copies added.

    Spark puts every ``--py-files`` file on the driver's ``PYTHONPATH`` but adds to the
    executors' ``sys.path`` only ``.zip``, ``.egg`` and ``.jar`` files, so a
    ``txstore-*.whl`` there leaves executors without txstore (``No module named 'txstore'``).
    A wheel of pure Python is a zip: its copy named ``.zip`` is added with ``addPyFile``.
    """
    from pyspark import SparkFiles

    context = spark.sparkContext
    given = context.getConf().get("spark.submit.pyFiles", "") or ""
    added = []
    for entry in filter(None, given.split(",")):
        name = entry.rsplit("/", 1)[-1]
        if not name.lower().endswith(".whl"):
            continue
        fetched = Path(SparkFiles.getRootDirectory()) / name  # where SparkContext copied it
        source = fetched if fetched.is_file() else Path(entry.removeprefix("file:"))
        if not source.is_file():
            continue
        copy = (
            Path(tempfile.mkdtemp(prefix="txstore-wheel-", dir=SparkFiles.getRootDirectory())) / f"{name}.zip"
        )
        shutil.copyfile(source, copy)
        context.addPyFile(str(copy))
        added.append(copy.name)
    return added


def start_spark(
    app_name: str,
    remote: str | None = None,
    ship_txstore: bool = True,
    stop: threading.Event | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    quiet: bool = True,
) -> object:
    """:func:`spark_session`, started in a thread of its own while this thread waits for it.

    The waiting thread answers signals at any moment, and PySpark, which installs its own SIGINT
    handler only when started in the main thread, installs none: a Ctrl-C during start-up is the
    job's (a first lets the batch finish, a second stops at once), never PySpark's (Py4J tracebacks).

    Under Spark Connect (``remote``) the wait is bounded: the server's address must accept a TCP
    connection and the session answer within ``connect_timeout`` seconds, else
    :class:`SparkStartFailed` names the address and why (connection refused, unknown host); a
    stop (``stop`` set by SIGTERM or a first Ctrl-C) ends the wait at once
    (:class:`SparkStartAbandoned`). A classic start that fails says its Java cause.
    """
    outcome: dict[str, Any] = {}
    problem: list[str] = []  # the last reason the Connect server's address did not answer
    deadline = time.monotonic() + connect_timeout
    abandoned = threading.Event()
    creating = threading.Event()  # a Connect client is being made: it will be the default session
    decided = threading.Lock()

    def start() -> None:
        try:
            if remote:
                host, port = connect_address(remote)
                while (reason := unreachable(host, port, min(5.0, connect_timeout))) is not None:
                    problem[:] = [reason]
                    if abandoned.wait(0.5):
                        return
                problem.clear()
                with decided:
                    if abandoned.is_set():
                        return
                    creating.set()
            outcome["session"] = spark_session(app_name, remote, ship_txstore, quiet)
        except BaseException as e:  # told by the waiting thread; nothing printed from here
            outcome["error"] = e

    thread = threading.Thread(target=start, name="txstore-spark-start", daemon=True)
    thread.start()
    while not outcome and (remote or thread.is_alive()):
        thread.join(0.1)
        if remote and not outcome:
            where = shown_address(remote)
            if stop is not None and stop.is_set():
                _abandon_connect(abandoned, creating, decided)
                raise SparkStartAbandoned(f"stopped while waiting for the Spark Connect server at {where}")
            if time.monotonic() >= deadline:
                _abandon_connect(abandoned, creating, decided)
                why = f": {problem[0]}" if problem else ""
                raise SparkStartFailed(
                    f"the Spark Connect server at {where} did not answer within {connect_timeout:g} s{why}; "
                    f"start it, or correct --remote / {SPARK_REMOTE_ENV} (--connect-timeout sets the wait)"
                )
    if "error" in outcome:
        error = outcome["error"]
        if isinstance(error, TxstoreError):
            raise error
        cause = java_cause(error) or first_line(error)
        where = f" (Spark Connect at {shown_address(remote)})" if remote else ""
        raise SparkStartFailed(f"Spark did not start{where}: {cause}") from error
    return outcome["session"]


def _abandon_connect(abandoned: threading.Event, creating: threading.Event, decided: threading.Lock) -> None:
    """Give up a Spark Connect start: no client is made from now on, and the one being made, if
    any, is closed: its exit handler (an RPC to the server, retried for minutes) would hold the
    process at exit. The client becomes the default session before its first RPC, without any
    network call before, so it is waited for (a few seconds at most)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    with decided:
        abandoned.set()
    if not creating.is_set():
        return
    session: Any = None
    until = time.monotonic() + 10
    while session is None and time.monotonic() < until:
        session = getattr(RemoteSparkSession, "_default_session", None)
        if session is None:
            time.sleep(0.05)
    if session is not None:
        try:
            session.client.close()
        except Exception as e:  # a channel that will not close: exit anyway
            log.debug("closing the Spark Connect client failed: %s", first_line(e))


def _connect_session(app_name: str, remote: str, ship_txstore: bool) -> object:
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    # A session of its own (create, not getOrCreate): the caller stops it when done, which must
    # never close another session of this process (a notebook's, a test's) that getOrCreate returns.
    session: Any = RemoteSparkSession.builder.remote(remote).appName(app_name).create()
    _ = session.version  # one round trip: the server answers now, while start_spark bounds the wait
    if ship_txstore:
        from txstore.spark.runtime.pyfiles import build_py_files

        with tempfile.TemporaryDirectory(prefix="txstore-artifact-") as tmp:
            session.addArtifacts(str(build_py_files(Path(tmp) / "txstore.zip")), pyfile=True)
    return session


class LazySparkSession:
    """The SparkSession, created on first use.

    Planning needs only PostgreSQL and Kafka, so bad settings, an unreachable
    database or broker, a missing schema or topic fail in a second instead of
    after a JVM has started, and a batch with nothing new starts no Spark at all.
    """

    def __init__(
        self,
        app_name: str,
        started: Callable[[], object] | None = None,
        remote: str | None = None,
        ship_txstore: bool = True,
        refused: Callable[[], bool] = lambda: False,
        stop: threading.Event | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        quiet: bool = True,
    ) -> None:
        """``started`` runs once the session exists; while ``refused()`` is true no session is
        started (``KeyboardInterrupt``). ``stop`` and ``connect_timeout``: see :func:`start_spark`."""
        self.app_name = app_name
        self.refused = refused
        self.started = started
        self.remote = remote
        self.ship_txstore = ship_txstore
        self.stop = stop
        self.connect_timeout = connect_timeout
        self.quiet = quiet
        self._session: object | None = None

    @property
    def underlying_session(self) -> Any:
        """The session itself (started now if need be)."""
        if self._session is None:
            if self.refused():
                raise KeyboardInterrupt  # stopping now: never start Spark on the way out
            self._session = start_spark(
                self.app_name, self.remote, self.ship_txstore, self.stop, self.connect_timeout, self.quiet
            )
            FailPoints.from_env().hit("spark-started")
            if self.started is not None:
                self.started()
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.underlying_session, name)


def run_job_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    default_job: str,
    aggregate: Aggregate | None = None,
    add_options: Callable[[argparse.ArgumentParser], None] | None = None,
    make_aggregate: Callable[[argparse.Namespace], Aggregate] | None = None,
    make_job_options: Callable[[argparse.Namespace], Mapping[str, Any]] | None = None,
) -> int:
    """Parse the shared options, run the job, and turn any failure into one line.

    Give ``aggregate``, or ``make_aggregate`` to build it from the parsed
    options (the job's own, added by ``add_options``). With ``--sink
    idempotent`` the messages are stored instead and the aggregate is unused.
    ``make_job_options``: more keyword arguments of :class:`TransactionalJob` from the
    options (a ``dataframe_aggregate`` and ``results_table``, say).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_job_options(parser, default_job)
    if add_options:
        add_options(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.log_format)
    stop_now = StopNow()
    try:
        settings: JobSettings = job_settings(args)
        if make_aggregate is not None:
            aggregate = make_aggregate(args)
        if settings.sink == IDEMPOTENT:
            aggregate = None
        job_options = dict(make_job_options(args)) if make_job_options is not None else {}
        # Before Spark starts, so a SIGTERM while it starts stops the job after (or, waiting for
        # a Connect server, before) its first batch. Spark starts in a thread of its own
        # (start_spark), so PySpark installs no SIGINT handler over these. A second Ctrl-C
        # stops now (StopNow).
        stop = stop_on_signals()
        stop_now.install(stop)
        spark = LazySparkSession(
            f"txstore {settings.job}",
            remote=args.remote,
            ship_txstore=args.ship_txstore,
            refused=lambda: stop_now.requested,
            stop=stop,
            connect_timeout=args.connect_timeout,
            quiet=not args.verbose,
        )
        with TransactionalJob(spark, settings, aggregate, **job_options) as job:
            try:
                job.run(stop)
            except SparkStartAbandoned as e:
                log.info("job %s: %s; no batch ran", settings.job, e)
        return 0
    except KeyboardInterrupt:  # Ctrl-C twice (or once before the handlers were installed)
        second = stop_now.requested
        stop_now.now()  # whatever Spark started is killed, not left behind
        print(f"{prog}: {INTERRUPTED_NOW if second else 'interrupted'}", file=sys.stderr)
        return 130
    except Exception as e:
        if stop_now.requested:  # what Py4J raised once Spark was killed under it
            print(f"{prog}: {INTERRUPTED_NOW}", file=sys.stderr)
            return 130
        if isinstance(e, (MetricsPortInUse, ResultsTableInvalid)):  # usage errors, like argparse's: exit 2
            for line in str(e).splitlines():
                print(f"{prog}: error: {line}", file=sys.stderr)
            return 2
        if args.verbose:
            log.exception("failed")
        if isinstance(e, TxstoreError):
            print(f"{prog}: error: {e}", file=sys.stderr)
        else:
            print(
                f"{prog}: error: {type(e).__name__}: {first_line(e)[:500]} (rerun with --verbose for a traceback)",
                file=sys.stderr,
            )
        return 1

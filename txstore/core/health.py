"""``txstore status --check``: each partition of a job judged the way Burrow judges a consumer.

Pure: :func:`evaluate` turns what is known of one partition (:class:`PartitionFacts`,
gathered by :func:`txstore.ops.health_facts.health_facts`) into a :class:`PartitionHealth`, in this
order:

1. ``UNKNOWN``: Kafka was not given or did not answer, so the lag cannot be known;
2. ``ERR``: the stored offset is outside the log (aged out, beyond the log end, the
   partition gone) or the log is another one (a recreated topic: another topic ID, or
   another message at the last offset counted). The same checks, and the same one-line
   errors, as a batch's planning (:func:`txstore.core.ranges.plan_ranges`) and reading;
3. ``OK``: no lag (whether or not an instance runs);
4. ``STOP``: lag, and no instance holds the job lock;
5. ``STALL``: lag, an instance runs, and the lag has waited for longer than ``stall_after``
   with no commit: since the last commit, or since the oldest message not counted was
   written if that was later (:attr:`PartitionFacts.unread_since`, its Kafka timestamp).
   A healthy ``--interval`` job that committed everything and sat idle has an old last
   commit; messages written after it are not STALL until they have waited ``stall_after``
   (its next batch takes them before). The stored facts cannot tell this alone:
   ``txn_offsets`` keeps the offset and when it moved, and ``lag_samples`` the backlog each
   commit started from, but not the log end the last commit was planned with, so whether
   the lag was already there at the last commit is read off the first message's timestamp.
   A message without one, or that cannot be read, leaves the last commit as the measure;
   so do producers' timestamps from before the last commit (a backfill with old event
   times), and clocks apart (Kafka's and PostgreSQL's) shift the measure by their skew;
6. ``WARN``: the backlog grew at each of the partition's last commits
   (``txn_offsets.lag_samples``: at least :data:`MIN_SAMPLES`, each larger than the
   one before): the job runs and commits, but falls behind;
7. ``OK`` otherwise.

A partition Kafka has in a topic the job stores offsets for, but with no row of its own
(the topic gained partitions, or was recreated with more, since the job last planned;
``offset`` and ``last_commit`` None), is judged as the job will read it: from its
log-start offset, so its lag is every message it holds. It cannot be ERR; with no
messages it is OK; with messages STOP if no instance runs, else STALL once its oldest
message has waited longer than ``stall_after`` (there is no commit to measure from, and
a running job starts it at its next batch; without that message's timestamp nothing says
how long it waited, so it is not STALL).

STALL, STOP and ERR are critical (exit 2), WARN a warning (exit 1); UNKNOWN exits 3,
as Nagios plugins do.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from txstore.core.errors import TxstoreError
from txstore.core.fingerprint import Fingerprint, recreated_error
from txstore.core.ranges import PartitionHistory, PartitionWatermarks, plan_ranges, reset_command

OK = "OK"
WARN = "WARN"
STALL = "STALL"
STOP = "STOP"
ERR = "ERR"
UNKNOWN = "UNKNOWN"
CRITICAL = frozenset({STALL, STOP, ERR})
MIN_SAMPLES = 3
"""A WARN needs at least this many lag samples, each larger than the one before."""
STALL_AFTER = timedelta(minutes=5)

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3
EXIT_NO_SUCH_JOB = 4
"""``--job`` names no job the database knows (a typo): not UNKNOWN, which a liveness probe lets
pass, but its own code, outside Nagios' 0-3 (Nagios reports it as out of bounds, never OK)."""
LEVELS = {
    EXIT_OK: "OK",
    EXIT_WARNING: "WARNING",
    EXIT_CRITICAL: "CRITICAL",
    EXIT_UNKNOWN: "UNKNOWN",
    EXIT_NO_SUCH_JOB: "NO-SUCH-JOB",
}


@dataclass(frozen=True)
class PartitionFacts:
    """What is known of one partition of a job.

    ``offset`` and ``last_commit`` None: the job has no row for the partition yet (it
    starts it at the log start). ``watermarks``: Kafka's offsets (None: Kafka does not have
    the partition, or Kafka was not asked or did not answer, which ``kafka_problem`` says);
    ``history`` what is stored beside the offset;
    ``topic_id`` Kafka's topic ID now (None: unknown); ``found`` the message now at
    ``history.last.offset`` (None: none there, or not looked at); ``lag_samples`` the
    backlog the last commits started from, oldest first; ``unread_since`` when the oldest
    message not counted (the first at or after ``offset``) was written, by its Kafka
    timestamp (None: no lag, not looked at, no timestamp, or not read).
    """

    job: str
    topic: str
    partition: int
    offset: int | None
    last_commit: datetime | None
    running: bool
    watermarks: PartitionWatermarks | None
    kafka_problem: str | None = None
    history: PartitionHistory = field(default_factory=PartitionHistory)
    topic_id: str | None = None
    found: Fingerprint | None = None
    lag_samples: tuple[int, ...] = ()
    unread_since: datetime | None = None


@dataclass(frozen=True)
class PartitionHealth:
    job: str
    topic: str
    partition: int
    status: str
    offset: int | None  # None: no row yet (lag counted from the log start)
    log_end: int | None
    lag: int | None
    last_commit: datetime | None
    seconds_since_commit: int | None
    running: bool
    lag_samples: tuple[int, ...]
    reason: str  # one line: what is wrong and what to run next ("" when OK)
    unread_since: datetime | None = None  # when the oldest message not counted was written


def evaluate(facts: PartitionFacts, now: datetime, stall_after: timedelta = STALL_AFTER) -> PartitionHealth:
    """The partition's status (see the module's docstring for the rules, in order)."""
    f = facts
    where = f"job {f.job!r} topic {f.topic!r} partition {f.partition}"
    idle = max(0, int((now - f.last_commit).total_seconds())) if f.last_commit is not None else None
    marks = f.watermarks
    start = f.offset if f.offset is not None else marks.low if marks is not None else None
    lag = marks.high - start if marks is not None and start is not None else None
    not_started = "a partition the job has not started"

    def health(status: str, reason: str = "") -> PartitionHealth:
        return PartitionHealth(
            f.job,
            f.topic,
            f.partition,
            status,
            f.offset,
            marks.high if marks is not None else None,
            lag,
            f.last_commit,
            idle,
            f.running,
            f.lag_samples,
            reason,
            f.unread_since,
        )

    if f.kafka_problem is not None:
        return health(UNKNOWN, f"{where}: lag unknown: {f.kafka_problem}")
    problem = out_of_log(f)
    if problem:
        return health(ERR, problem)
    assert lag is not None and start is not None
    if lag <= 0:
        return health(OK)
    if not f.running:
        if idle is None:
            when = f"no offset stored: {not_started}; it starts at the earliest offset {start}"
        else:
            when = f"last commit {idle}s ago"
        return health(
            STOP, f"{where}: lag {lag} and no instance of the job is running ({when}); start the job"
        )
    since, written = f.last_commit, ""
    if f.unread_since is not None and (since is None or f.unread_since > since):
        since = f.unread_since  # written after the last commit (or there is none): it waits since then
        written = f"; the oldest message not counted was written {int((now - since).total_seconds())}s ago"
    if since is not None and now - since > stall_after:
        committed = f"no commit for {idle}s" if idle is not None else f"no offset stored ({not_started})"
        return health(
            STALL,
            f"{where}: lag {lag} and {committed}{written} (--stall-after {_seconds(stall_after)}s) "
            "although an instance holds the job lock; read its log for the batch it is stuck in, "
            "or restart it",
        )
    if growing(f.lag_samples):
        samples = ", ".join(str(s) for s in f.lag_samples)
        return health(
            WARN,
            f"{where}: the backlog grew at each of the last {len(f.lag_samples)} commits ({samples}; "
            f"lag now {lag}): the job falls behind; give it more executors, or a larger "
            "--max-offsets-per-batch",
        )
    return health(OK)


def out_of_log(f: PartitionFacts) -> str | None:
    """Planning's own error for this partition (offset outside the log, topic recreated), or
    the reader's for another message at the last offset counted; None: the log is the one counted
    (or nothing is stored for the partition yet)."""
    if f.offset is None:
        return None
    key = (f.topic, f.partition)
    try:
        plan_ranges(
            f.job,
            {key: f.offset},
            [f.watermarks] if f.watermarks is not None else [],
            {key: f.history},
            {f.topic: f.topic_id} if f.topic_id is not None else {},
        )
    except TxstoreError as e:
        return str(e)
    last = f.history.last
    if last is not None and f.found is not None and f.found != last:
        return str(
            recreated_error(
                f.job,
                f.topic,
                f.partition,
                f"last counted message {last.describe()}",
                f.found.describe(),
                reset_command(f.job, f.topic, f.partition, "--to-earliest"),
            )
        )
    return None


def growing(samples: Sequence[int]) -> bool:
    """At least :data:`MIN_SAMPLES` samples, each larger than the one before."""
    return len(samples) >= MIN_SAMPLES and all(a < b for a, b in itertools.pairwise(samples))


def exit_code(results: Sequence[PartitionHealth], unknown_job: str | None = None) -> int:
    """4 if ``unknown_job`` (``--job`` names no job the database knows), else 2 if any partition
    is critical, else 3 if any is unknown (or there is none), else 1 if any warns, else 0."""
    if unknown_job:
        return EXIT_NO_SUCH_JOB
    statuses = {r.status for r in results}
    if statuses & CRITICAL:
        return EXIT_CRITICAL
    if UNKNOWN in statuses or not results:
        return EXIT_UNKNOWN
    if WARN in statuses:
        return EXIT_WARNING
    return EXIT_OK


def summary(results: Sequence[PartitionHealth], job: str | None, unknown_job: str | None = None) -> str:
    """The first line: the level, the jobs checked and how many partitions have each status.
    ``unknown_job``: why ``job`` names no job the database knows (a typo): the whole line."""
    level = LEVELS[exit_code(results, unknown_job)]
    if unknown_job:
        return f"{level}: {unknown_job}; check --job"
    if not results:
        return f"{level}: no stored offsets" + (f" for job {job!r}" if job else "")
    jobs = sorted({r.job for r in results})
    counts = [f"{sum(r.status == s for r in results)} {s}" for s in (ERR, STOP, STALL, UNKNOWN, WARN, OK)]
    named = ", ".join(repr(j) for j in jobs)
    return f"{level}: job{'s' if len(jobs) > 1 else ''} {named}: " + ", ".join(
        c for c in counts if not c.startswith("0 ")
    )


def format_check(results: Sequence[PartitionHealth], job: str | None, unknown_job: str | None = None) -> str:
    """The summary line, then one line per partition that is not OK."""
    lines = [summary(results, job, unknown_job)]
    lines += [f"{r.status} {r.reason}" for r in results if r.status != OK]
    return "\n".join(lines)


def as_json(
    results: Sequence[PartitionHealth], job: str | None, unknown_job: str | None = None
) -> dict[str, Any]:
    code = exit_code(results, unknown_job)
    return {
        "status": LEVELS[code],
        "exit_code": code,
        "summary": summary(results, job, unknown_job),
        "partitions": [asdict(r) for r in results],
    }


def _seconds(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return str(int(seconds)) if seconds == int(seconds) else str(seconds)

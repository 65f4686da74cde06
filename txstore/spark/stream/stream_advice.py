"""What a streaming query's lines tell its user to do: a stream's options and steps, not a job's flags.

The stream source and sink (:mod:`~txstore.spark.stream.stream_source`, :mod:`~txstore.spark.stream.stream_sink`)
raise the lines of the shared planning, reading and committing code, written for ``count_topic``
and ``txstore`` commands: "rerun with --fail-on-data-loss false", "check --topic", "Run the job
again". A streaming query has no flags and is not rerun: :func:`for_stream` restates each such
advice as something a streaming user can do (``.option('name', ...)``, restarting the query), and
keeps the rest of the line (the job, topic, partition and offset) as it is:

- messages aged out before they were counted, found when planning or (gone since) by a reading
  task: :func:`data_loss_advice` (one way today, a reset; a stream option that skips them would
  add its own);
- a ``txstore reset ... --execute`` to run: run it, then restart the query with a new
  ``checkpointLocation``: the old checkpoint starts the next micro-batch where the reset moved
  away from, and the query would stop on it again;
- "Run the job again", "start the job again", "Rerun the job": restart the query;
- ``--topic``, ``--bootstrap-servers``, ``--kafka-option X``, ``--starting-offsets``,
  ``--table``/``--key``/``--merge``: the options ``subscribe``, ``kafka.bootstrap.servers``,
  ``kafka.X``, ``startingOffsets``, ``txstore.table``/``key``/``merge``.

``tests/spark/stream/test_stream_advice.py`` makes the lines with the code that raises them where it can,
checks that each phrase restated here is still the shared code's (a phrase reworded there would
slip through), and that no flag of a job's is left in what the stream prints.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from txstore.core.errors import ResultsTableInvalid, TxstoreError
from txstore.core.ranges import reset_command

NEW_CHECKPOINT = (
    "restart the query with a new checkpointLocation (or delete this one): it then starts at the "
    "offsets in txn_offsets"
)


def data_loss_advice(job: str, topic: str, partition: int) -> str:
    """What a streaming query can do about messages of ``topic`` ``partition`` that aged out of
    Kafka before they were counted (the query has stopped): two ways, joined with "; or "."""
    ways = [
        "restart the query with option failOnDataLoss false (the same checkpoint): it skips them and "
        "records them in txn_lost_ranges",
        "skip them unrecorded: "
        f"{reset_command(job, topic, partition, '--to-earliest')}, then {NEW_CHECKPOINT}",
    ]
    return "To go on, " + "; or ".join(ways)


_DATA_LOSS = re.compile(
    r"topic (?P<topic>'[^']*'|\"[^\"]*\") partition (?P<partition>\d+): stored offset \d+ is below the "
    r"log-start offset .*? before they were counted\. "
    r"(?P<advice>To skip them and record the loss in txn_lost_ranges, rerun with --fail-on-data-loss false)"
)
_READ_LOSS = re.compile(
    r"^(?P<topic>'[^']*'|\"[^\"]*\") partition (?P<partition>\d+): offset \d+ is no longer in Kafka "
    r"\(range \d+ -> \d+\); messages aged out before they were counted \(.*\)$"
)
_RESET = re.compile(r"txstore reset --job .*?--execute")


def _after_reset(match: re.Match[str], pattern: bool = False) -> str:
    command = match.group(0)
    if "--forget" in command and "--partition" not in command and pattern:
        # subscribePattern: a topic Kafka no longer has matches no more once forgotten
        return f"{command}, then {NEW_CHECKPOINT}"
    if "--forget" in command and "--partition" not in command:
        return (
            f"{command}, then restart the query without that topic in subscribe and with a new "
            "checkpointLocation (or delete this one)"
        )
    return f"{command}, then {NEW_CHECKPOINT}"


_PHRASES: tuple[tuple[str, str], ...] = (
    # the job lock (txstore.postgres.locks), taken by the stream's planner
    ("start the job again when it has finished", "restart the query when it has finished"),
    # a topic the job stored offsets for, gone (txstore.core.ranges.topic_missing_now)
    ("Run the job again once the topic exists", "Restart the query once the topic exists"),
    # the sink's conflicts (txstore.core.errors)
    ("Was the offset reset while the job ran?", "Was the offset reset while the query ran?"),
    ("Rerun the job to plan from the stored offset.", f"To plan from the stored offset, {NEW_CHECKPOINT}."),
    (
        "Is another instance of this job running? Rerun it to plan from the stored offset.",
        f"Is another query of this job running? To plan from the stored offset, {NEW_CHECKPOINT}.",
    ),
    # Kafka (txstore.kafka.client)
    ("check --topic", "check .option('subscribe', ...)"),
    (
        "check --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS, the network, and --kafka-option security settings",
        "check .option('kafka.bootstrap.servers', ...), the network, and the kafka.* security options "
        "(.option('kafka.security.protocol', ...) and the like)",
    ),
    (
        "check --kafka-option sasl.username, sasl.password and sasl.mechanisms",
        "check .option('kafka.sasl.username', ...), kafka.sasl.password and kafka.sasl.mechanisms",
    ),
    ("check --kafka-option ssl.ca.location", "check .option('kafka.ssl.ca.location', ...)"),
    ("check --kafka-option", "check the kafka.* options"),
    # starting offsets (txstore.core.starting; the source names its subscribe, subscribePattern or assign)
    ("--starting-offsets JSON", "startingOffsets JSON"),
    ("--starting-offsets", "option startingOffsets"),
)
# A results table's checks (txstore.postgres.results.results_check) name aggregate.py's flags.
_TABLE_FLAGS = re.compile(r"(?<![\w-])--(table|key|merge)\b")


def restate(text: str, job: str | None = None, pattern: bool = False) -> str:
    """One line of the shared code, its advice restated for a streaming query (``job``: the
    query's, for lines of a reading task, which do not name it; ``pattern``: the query reads a
    ``subscribePattern``, which need not be changed to drop a deleted topic)."""
    loss = _DATA_LOSS.search(text)
    read_loss = _READ_LOSS.match(text) if job is not None else None
    if read_loss is not None and job is not None:
        topic = ast.literal_eval(read_loss.group("topic"))
        advice = data_loss_advice(job, topic, int(read_loss.group("partition")))
        text = f"job {job!r} topic {text}. {advice}"
    elif loss is not None:
        topic = ast.literal_eval(loss.group("topic"))
        job_match = re.match(r"job (?P<job>'[^']*'|\"[^\"]*\")", text)
        job = ast.literal_eval(job_match.group("job")) if job_match else "JOB"
        advice = data_loss_advice(job, topic, int(loss.group("partition")))
        text = text[: loss.start("advice")] + advice + text[loss.end("advice") :]
    else:
        text = _RESET.sub(functools.partial(_after_reset, pattern=pattern), text)
    for batch, stream in _PHRASES:
        text = text.replace(batch, stream)
    return _TABLE_FLAGS.sub(r"txstore.\1", text)


def for_stream(error: TxstoreError, job: str | None = None, pattern: bool = False) -> TxstoreError:
    """``error`` (same class where it can be) with its advice restated for a streaming query of
    ``job`` (``pattern``: one reading a ``subscribePattern``)."""
    if isinstance(error, ResultsTableInvalid):
        return ResultsTableInvalid([restate(p, job) for p in error.problems])
    text = restate(str(error), job, pattern)
    if text == str(error):
        return error
    new = type(error).__new__(type(error), text)  # not __init__: some take the parts of their line
    new.__dict__.update(error.__dict__)
    new.args = (text,)
    return new if str(new) == text else TxstoreError(text)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def restating(method: _Method) -> _Method:
    """A method of the stream's source or sink (``self.options.job``) whose txstore errors are
    restated for a streaming query (:func:`for_stream`)."""

    @functools.wraps(method)
    def restated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except TxstoreError as e:
            options = getattr(self, "options", None)  # a writer's __init__ may raise before it is set
            pattern = getattr(getattr(options, "read", None), "pattern", None) is not None
            raise for_stream(e, getattr(options, "job", None), pattern) from None

    return cast(_Method, restated)


def restated_rows(rows: Iterator[Any], job: str) -> Iterator[Any]:
    """A reading task's rows, a txstore error raised while they are read restated."""
    try:
        yield from rows
    except TxstoreError as e:
        raise for_stream(e, job) from None

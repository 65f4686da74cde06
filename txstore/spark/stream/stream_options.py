"""The options of ``spark.readStream.format("txstore")``, parsed once, checked at ``load()``.

The batch source's options (:func:`~txstore.spark.source.read_options.parse_read_options`) without
``endingOffsets``, plus the stream's own: ``maxOffsetsPerTrigger``,
``txstore.countMessages``, ``txstore.tasks`` and (tests) ``txstore.failpoints``. The source
itself is :mod:`txstore.spark.stream.stream_source`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from txstore.core.errors import ConfigError
from txstore.core.failpoints import FailPoints
from txstore.spark.source.read_options import ReadOptions, option_names, parse_read_options, shown

GIVEN_BY = ".option('txstore.databaseUrl') (or TXSTORE_DATABASE_URL on the driver)"
"""Where the stream's database URL comes from, as its connection errors name it."""
COUNT_MESSAGES_OPTION = "txstore.countmessages"
TASKS_OPTION = "txstore.tasks"
FAILPOINTS_OPTION = "txstore.failpoints"
STREAM_ONLY_OPTIONS = ("maxoffsetspertrigger", COUNT_MESSAGES_OPTION, TASKS_OPTION, FAILPOINTS_OPTION)
"""Options of ``readStream.format("txstore")`` that a batch read does not take (lower case)."""
COUNT_SCHEMA = (
    "topic string, partition int, txstore_from bigint, txstore_until bigint, txstore_messages bigint"
)
"""The rows of ``readStream.format("txstore").option("txstore.countMessages", "true")``: one per
range of a micro-batch (its offsets ``[txstore_from, txstore_until)``), with how many messages its
task read. The sink checks each against the micro-batch's planned ranges and its task's receipt."""


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    job: str
    database_url: str
    max_offsets_per_trigger: int | None = None
    count_messages: bool = False  # txstore.countMessages: one row per range, its message count
    # txstore.tasks: the most Spark tasks a micro-batch is read in; None: a task per range
    tasks: int | None = None
    failpoints: str = ""  # tests: txstore.failpoints (txstore.core.failpoints), in the reading tasks


def parse_stream_options(
    options: Mapping[str, str], environ: Mapping[str, str], default_tasks: int | None = None
) -> StreamOptions:
    """The batch source's options (:func:`~txstore.spark.source.read_options.parse_read_options`) without
    ``endingOffsets`` (``minPartitions``: a micro-batch's big ranges are cut into pieces, each
    read by its own task, committed together), plus ``maxOffsetsPerTrigger``, ``txstore.countMessages``,
    ``txstore.tasks`` (else ``default_tasks``, what :func:`txstore.register` measured) and
    ``txstore.failpoints``; ``txstore.job`` required."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    names = option_names(options)
    if "endingoffsets" in given:
        raise ConfigError(
            f"option {shown(names, 'endingOffsets')} is not supported by readStream.format('txstore'): "
            "each micro-batch reads one range per partition up to the log end (limit it with "
            "maxOffsetsPerTrigger)"
        )
    if not given.get("txstore.job", "").strip():
        raise ConfigError(
            f"option {shown(names, 'txstore.job')} is required by readStream.format('txstore'): the job "
            "whose offsets in txn_offsets the stream continues and commits"
        )
    count_messages = parse_count_messages(
        given.get(COUNT_MESSAGES_OPTION), shown(names, COUNT_MESSAGES_OPTION)
    )
    tasks_text = given.get(TASKS_OPTION)
    tasks = default_tasks if tasks_text is None else parse_tasks(tasks_text, shown(names, TASKS_OPTION))
    failpoints = given.get(FAILPOINTS_OPTION, "")
    FailPoints.parse(failpoints)  # a bad one fails at load()
    limit_text = given.get("maxoffsetspertrigger")
    limit = None
    if limit_text is not None:
        try:
            limit = int(limit_text)
        except ValueError:
            limit = 0
        if limit < 1:
            raise ConfigError(
                f"option {shown(names, 'maxOffsetsPerTrigger')} must be a whole number of at least 1, "
                f"got {limit_text!r}"
            )
    # The batch source's options, with their names as given (for its error lines).
    batch = {k: v for k, v in options.items() if str(k).lower() not in STREAM_ONLY_OPTIONS}
    read = parse_read_options(batch, environ)
    assert read.job is not None and read.database_url is not None
    return StreamOptions(read, read.job, read.database_url, limit, count_messages, tasks, failpoints)


def parse_count_messages(text: str | None, name: str = "txstore.countMessages") -> bool:
    """``txstore.countMessages``: ``true`` or ``false`` (the default)."""
    if text is None or text.strip().lower() == "false":
        return False
    if text.strip().lower() == "true":
        return True
    raise ConfigError(f"option {name} must be true or false, got {text!r}")


def parse_tasks(text: str, name: str = "txstore.tasks") -> int:
    """``txstore.tasks``: a whole number of at least 1."""
    try:
        tasks = int(text)
    except ValueError:
        tasks = 0
    if tasks < 1:
        raise ConfigError(
            f"option {name} must be a whole number of at least 1 (the most Spark tasks a "
            f"micro-batch's ranges are read in), got {text!r}"
        )
    return tasks

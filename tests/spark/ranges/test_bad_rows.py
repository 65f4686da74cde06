"""Bisection over offsets for the messages a query or a results table cannot take (pure)."""

from __future__ import annotations

import random

import psycopg
from pyspark.errors import AnalysisException, PythonException

from txstore.core.errors import TopicRecreated
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import REASON_CHARS, BadOffset
from txstore.spark.ranges.bad_rows import failure_reason, find_bad_offsets, is_row_failure, without


def fails_on(bad: set[tuple[int, int]], tried: list[OffsetRange]):  # type: ignore[no-untyped-def]
    def fails(piece: OffsetRange) -> str | None:
        tried.append(piece)
        hit = [o for p, o in bad if p == piece.partition and piece.from_offset <= o < piece.until_offset]
        return f"ValueError: offset {min(hit)}" if hit else None

    return fails


def test_every_bad_offset_is_found_lowest_first_with_the_reason_of_its_own_piece() -> None:
    rng = random.Random(11)
    for _ in range(200):
        starts = [rng.randrange(0, 5) for _ in range(3)]
        ranges = [OffsetRange("t", p, start, start + rng.randrange(1, 70)) for p, start in enumerate(starts)]
        bad = {
            (r.partition, rng.randrange(r.from_offset, r.until_offset))
            for r in ranges
            for _ in range(rng.randrange(0, 4))
        }
        found = find_bad_offsets(ranges, fails_on(bad, []), first_only=False)
        assert [(b.partition, b.offset) for b in found] == sorted(bad)
        assert all(b.reason == f"ValueError: offset {b.offset}" for b in found)
        first = find_bad_offsets(ranges, fails_on(bad, []), first_only=True)
        assert list(first) == list(found[:1])


def test_the_search_reads_a_few_pieces_per_bad_message_not_every_offset() -> None:
    tried: list[OffsetRange] = []
    found = find_bad_offsets([OffsetRange("t", 0, 0, 1_000_000)], fails_on({(0, 654_321)}, tried), True)
    assert [b.offset for b in found] == [654_321]
    assert len(tried) <= 2 * 21  # two halves a level, twenty levels


def test_a_failure_no_single_message_reproduces_finds_nothing() -> None:
    # Fails only with offsets 3 and 4 together: no one message is to blame.
    def fails(piece: OffsetRange) -> str | None:
        return (
            "NumericValueOutOfRange: overflow" if piece.from_offset <= 3 and piece.until_offset > 4 else None
        )

    assert find_bad_offsets([OffsetRange("t", 0, 0, 10)], fails, first_only=False) == ()


def test_pieces_without_the_bad_messages_cover_every_other_offset_and_verify_only_from_the_start() -> None:
    verify = Fingerprint(4, 1, "d")
    pieces = [
        OffsetRange("t", 0, 5, 12, verify=verify),
        OffsetRange("t", 0, 12, 20),
        OffsetRange("t", 1, 0, 3),
    ]
    bad = [
        BadOffset("t", 0, 5, "r"),
        BadOffset("t", 0, 9, "r"),
        BadOffset("t", 0, 19, "r"),
        BadOffset("t", 1, 1, "r"),
    ]
    cut = without(pieces, bad)
    covered = {(p.partition, o) for p in cut for o in range(p.from_offset, p.until_offset)}
    everything = {(p.partition, o) for p in pieces for o in range(p.from_offset, p.until_offset)}
    assert covered == everything - {(b.partition, b.offset) for b in bad}
    assert [(p.partition, p.from_offset, p.until_offset) for p in cut] == [
        (0, 6, 9),
        (0, 10, 12),
        (0, 12, 19),
        (1, 0, 1),
        (1, 2, 3),
    ]
    assert all(p.verify is None for p in cut)  # the first piece started on a bad message
    kept = without([OffsetRange("t", 0, 5, 12, verify=verify)], [BadOffset("t", 0, 8, "r")])
    assert [p.verify for p in kept] == [verify, None]


def test_only_failures_a_message_can_cause_are_searched() -> None:
    assert is_row_failure(psycopg.errors.CharacterNotInRepertoire("invalid byte sequence"))
    assert is_row_failure(psycopg.errors.NotNullViolation("null value in column"))
    assert not is_row_failure(psycopg.OperationalError("server closed the connection"))
    assert not is_row_failure(TopicRecreated("job 'j' topic 't' partition 0: recreated"))
    assert not is_row_failure(ValueError("ours, not Spark's"))


def test_the_search_stops_once_more_than_its_limit_fail() -> None:
    # A table that refuses every row: each try is a Spark job, so the search must not go on
    # through every message of the batch.
    tried: list[OffsetRange] = []
    every = {(0, o) for o in range(10_000)}
    found = find_bad_offsets([OffsetRange("t", 0, 0, 10_000)], fails_on(every, tried), False, limit=5)
    assert [b.offset for b in found] == [0, 1, 2, 3, 4, 5]
    assert len(tried) < 2 * 14 * 6
    assert len(find_bad_offsets([OffsetRange("t", 0, 0, 10_000)], fails_on(every, []), True, limit=5)) == 1


class Py4JJavaError(Exception):
    """Named as py4j's: classic Spark's failed job, told by its name (no JVM needed here)."""


def test_a_failed_spark_job_is_searched_unless_the_query_is_wrong_or_the_failure_is_txstores() -> None:
    cast = Py4JJavaError(
        "An error occurred while calling o81.collect.\n: org.apache.spark.SparkNumberFormatException: "
        '[CAST_INVALID_INPUT] The value \'x\' of the type "STRING" cannot be cast to "INT"'
    )
    assert is_row_failure(cast)
    assert is_row_failure(PythonException(message="Traceback ...\nValueError: invalid literal for int()"))
    assert not is_row_failure(AnalysisException(message="[UNRESOLVED_COLUMN] x cannot be resolved"))
    assert not is_row_failure(
        PythonException(
            message="Traceback ...\ntxstore.core.errors.TopicRecreated: job 'j' topic 't': recreated"
        )
    )
    assert not is_row_failure(
        Py4JJavaError(
            "An error occurred while calling o1.collect.\ntxstore.core.errors.DataLoss: job 'j' topic 't'"
        )
    )


def test_the_reason_recorded_is_the_error_with_its_class_or_the_tasks_error_or_named_by_its_type() -> None:
    assert failure_reason(psycopg.errors.NotNullViolation('null value in column "n"\nDETAIL: row')) == (
        'NotNullViolation: null value in column "n"'
    )
    cast = Py4JJavaError(
        "An error occurred while calling o81.collect.\n: org.apache.spark.SparkNumberFormatException: "
        "[CAST_INVALID_INPUT] The value 'x' cannot be cast\n\tat org.apache.spark..."
    )
    assert (
        failure_reason(cast)
        == "SparkNumberFormatException: [CAST_INVALID_INPUT] The value 'x' cannot be cast"
    )
    assert (
        failure_reason(PythonException(message="Traceback ...\nValueError: bad int")) == "ValueError: bad int"
    )
    assert failure_reason(Py4JJavaError("no colon here")) == "Py4JJavaError: no colon here"
    task_failed = Py4JJavaError("Job aborted.\nPythonException: the worker died")
    assert failure_reason(task_failed) == "Py4JJavaError: Job aborted."
    assert len(failure_reason(Py4JJavaError("ValueError: " + "x" * 5000))) <= REASON_CHARS


def test_a_bad_offset_at_a_pieces_end_belongs_to_the_next_piece() -> None:
    pieces = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 10)]
    cut = without(pieces, [BadOffset("t", 0, 5, "r")])
    assert [(p.from_offset, p.until_offset) for p in cut] == [(0, 5), (6, 10)]

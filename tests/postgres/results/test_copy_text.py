"""Arrow batches as COPY text (txstore.postgres.results.copy_text): every value arrives in PostgreSQL as it was."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pyarrow as pa

from txstore.postgres.results.copy_text import copy_text


def test_awkward_values_survive_copy_text_into_postgresql_exactly(db: psycopg.Connection) -> None:
    texts = ["plain", "tab\there", "new\nline", "back\\slash", "cr\rlf", "\\N", "", None, "ключ €"]
    n = len(texts)
    batch = pa.RecordBatch.from_pydict(
        {
            "s": pa.array(texts, pa.string()),
            "d": pa.array(
                [Decimal("12345678901234567890.12"), Decimal("-0.01"), None] * 3, pa.decimal128(38, 2)
            ),
            "i": pa.array([2**62, -1, None] * 3, pa.int64()),
            "t": pa.array(
                [
                    datetime(2026, 1, 1, 12, 30, 0, 123456, tzinfo=timezone.utc),
                    None,
                    datetime(1970, 1, 1, tzinfo=timezone.utc),
                ]
                * 3,
                pa.timestamp("us", tz="Europe/Berlin"),
            ),
            "day": pa.array([date(2026, 2, 28), None, date(1, 1, 1)] * 3, pa.date32()),
            "b": pa.array([True, False, None] * 3, pa.bool_()),
            "bin": pa.array([b"\x00\xff\\\t", None, b""] * 3, pa.binary()),
            "f": pa.array([0.1, float("inf"), None] * 3, pa.float64()),
        }
    )
    db.execute(
        "CREATE TEMP TABLE rows (s text, d numeric(38, 2), i bigint, t timestamptz, day date, b boolean, "
        "bin bytea, f double precision, pos bigint)"
    )
    with db.cursor() as cur, cur.copy("COPY rows FROM STDIN") as copy:
        copy.write(copy_text(batch.slice(0, 4), 0))
        copy.write(copy_text(batch.slice(4), 4))  # a slice: offsets not starting at 0
    rows = db.execute("SELECT s, d, i, t, day, b, bin, f, pos FROM rows ORDER BY pos").fetchall()
    assert [r[-1] for r in rows] == list(range(n))
    assert [r[0] for r in rows] == texts
    expected = batch.to_pylist()
    for row, want in zip(rows, expected, strict=True):
        assert row[1] == want["d"]
        assert row[2] == want["i"]
        assert row[3] == want["t"]
        assert row[3] is None or row[3].utcoffset() is not None
        assert row[4] == want["day"]
        assert row[5] == want["b"]
        assert (bytes(row[6]) if row[6] is not None else None) == want["bin"]
        assert row[7] == want["f"]
    assert rows[0][3] == datetime(2026, 1, 1, 12, 30, 0, 123456, tzinfo=timezone.utc) + timedelta(0)


def test_without_positions_the_text_has_only_the_batch_columns() -> None:
    batch = pa.RecordBatch.from_pydict({"k": ["a", None], "n": [1, 2]})
    assert copy_text(batch) == b"a\t1\n\\N\t2\n"
    assert copy_text(batch, 7) == b"a\t1\t7\n\\N\t2\t8\n"


def test_instants_are_written_in_utc_so_the_two_hours_of_a_daylight_saving_fold_stay_two_values(
    db: psycopg.Connection,
) -> None:
    """Spark hands instants over in its session's zone (Europe/Berlin here): 00:30 and 01:30 UTC on
    2026-10-25 are both 02:30 there. The text carries UTC, so even a column without a time zone
    (which drops the offset) keeps them two values, a UTC wall time each."""
    first = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)
    second = datetime(2026, 10, 25, 1, 30, tzinfo=timezone.utc)
    batch = pa.RecordBatch.from_pydict(
        {"t": pa.array([first, second, None], pa.timestamp("us", tz="Europe/Berlin"))}
    )
    assert copy_text(batch) == b"2026-10-25 00:30:00.000000+00\n2026-10-25 01:30:00.000000+00\n\\N\n"
    db.execute("CREATE TEMP TABLE instants (zoned timestamptz, wall timestamp)")
    db.execute("SET TimeZone = 'Europe/Berlin'")  # the server's zone does not enter either column
    text = copy_text(pa.RecordBatch.from_arrays([batch.column(0), batch.column(0)], ["zoned", "wall"]))
    with db.cursor() as cur, cur.copy("COPY instants FROM STDIN") as copy:
        copy.write(text)
    rows = db.execute("SELECT zoned, wall FROM instants WHERE zoned IS NOT NULL ORDER BY zoned").fetchall()
    # (astimezone: Python never finds a datetime in a fold equal to one in another zone)
    assert [r[0].astimezone(timezone.utc) for r in rows] == [first, second]
    assert [r[1] for r in rows] == [first.replace(tzinfo=None), second.replace(tzinfo=None)]


def test_wall_times_and_dates_are_written_as_they_are() -> None:
    """TIMESTAMP_NTZ and DATE values have no zone: their text is the wall time and the day, unchanged."""
    batch = pa.RecordBatch.from_pydict(
        {
            "wall": pa.array([datetime(2026, 10, 25, 2, 30), None], pa.timestamp("us")),
            "day": pa.array([date(2026, 3, 29), date(1, 1, 1)], pa.date32()),
        }
    )
    assert copy_text(batch) == b"2026-10-25 02:30:00.000000\t2026-03-29\n\\N\t0001-01-01\n"

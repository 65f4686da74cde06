"""Arrow batches as COPY text (txstore.copy_text): every value arrives in PostgreSQL as it was."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pyarrow as pa

from txstore.copy_text import copy_text


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

"""Which results-table columns hold every value of the query's column exactly (issue 24).

The start-up check (txstore.postgres.results.results_check) refuses, before anything is read, a column
that would round a number, cut or pad a string, or put a time into a zone it does not
have: one line naming the column, both types and the ``ALTER TABLE`` that fixes it.
Pure checks over column facts, then the same over the catalog of a real PostgreSQL.
"""

from __future__ import annotations

import psycopg
import pytest

from txstore import ResultsTable
from txstore.postgres.results.results_check import (
    Column,
    TableFacts,
    UniqueIndex,
    describe_table,
    table_problems,
)


def facts(**columns: tuple[str, str, str]) -> TableFacts:
    """A table ``t`` keyed by ``k`` (text) with these columns: name -> (format_type, typname, category)."""
    cols = {"k": Column("k", "text", "text", "S", True, False)}
    cols.update({n: Column(n, t, typname, cat, True, False) for n, (t, typname, cat) in columns.items()})
    return TableFacts("r", (), cols, (UniqueIndex(("k",), True, False),))


def problems_of(
    spark_type: str, pg_type: str, typname: str, category: str, rule: str = "replace"
) -> list[str]:
    table = ResultsTable("t", ("k",), (("v", rule),))
    return table_problems(table, facts(v=(pg_type, typname, category)), [("k", "string"), ("v", spark_type)])


def key_problems_of(spark_type: str, pg_type: str, typname: str, category: str) -> list[str]:
    table = ResultsTable("t", ("k", "v"), (("n", "sum"),))
    cols = {
        "k": Column("k", "text", "text", "S", True, False),
        "v": Column("v", pg_type, typname, category, True, False),
        "n": Column("n", "bigint", "int8", "N", True, False),
    }
    table_facts = TableFacts("r", (), cols, (UniqueIndex(("k", "v"), True, False),))
    return table_problems(table, table_facts, [("k", "string"), ("v", spark_type), ("n", "bigint")])


ROUNDING = [
    # The issue's own: a counter at 2^24 in real, a bigint in double precision, 0.050 in numeric(10,1).
    (
        "bigint",
        "real",
        "float4",
        "N",
        "real holds integers exactly only up to 2^24 = 16777216, larger ones and sums round; "
        "ALTER TABLE t ALTER COLUMN v TYPE bigint",
    ),
    (
        "bigint",
        "double precision",
        "float8",
        "N",
        "double precision holds integers exactly only up to 2^53 = 9007199254740992, larger ones and sums "
        "round; ALTER TABLE t ALTER COLUMN v TYPE bigint",
    ),
    (
        "decimal(10,3)",
        "numeric(10,1)",
        "numeric",
        "N",
        "numeric(10,1) rounds to 1 decimal place, the query's values have 3; "
        "ALTER TABLE t ALTER COLUMN v TYPE numeric(12,3)",
    ),
    # Small integers are exact in a float, but their sums are not: never into floats.
    (
        "smallint",
        "real",
        "float4",
        "N",
        "real holds integers exactly only up to 2^24 = 16777216, larger ones and sums round; "
        "ALTER TABLE t ALTER COLUMN v TYPE smallint",
    ),
    (
        "int",
        "double precision",
        "float8",
        "N",
        "double precision holds integers exactly only up to 2^53 = 9007199254740992, larger ones and sums "
        "round; ALTER TABLE t ALTER COLUMN v TYPE integer",
    ),
    (
        "decimal(12,2)",
        "numeric(14,0)",
        "numeric",
        "N",
        "numeric(14,0) rounds to 0 decimal places, the query's values have 2; "
        "ALTER TABLE t ALTER COLUMN v TYPE numeric(16,2)",
    ),
    (
        "decimal(38,18)",
        "numeric(20,2)",
        "numeric",
        "N",
        "numeric(20,2) rounds to 2 decimal places, the query's values have 18; "
        "ALTER TABLE t ALTER COLUMN v TYPE numeric(38,18)",
    ),
    # PostgreSQL 15's negative scales round whole numbers.
    (
        "bigint",
        "numeric(5,-2)",
        "numeric",
        "N",
        "numeric(5,-2) rounds to multiples of 100; ALTER TABLE t ALTER COLUMN v TYPE bigint",
    ),
    (
        "decimal(5,0)",
        "numeric(5,-2)",
        "numeric",
        "N",
        "numeric(5,-2) rounds to multiples of 100; ALTER TABLE t ALTER COLUMN v TYPE numeric(7,0)",
    ),
    # oid (and the reg* types) are numbers to PostgreSQL, but not integers: -1 becomes 4294967295.
    (
        "int",
        "oid",
        "oid",
        "N",
        "only integer and numeric columns hold integers exactly; ALTER TABLE t ALTER COLUMN v TYPE integer",
    ),
    (
        "double",
        "real",
        "float4",
        "N",
        "real keeps 24 bits of a double's 53, so doubles round; "
        "ALTER TABLE t ALTER COLUMN v TYPE double precision",
    ),
    (
        "string",
        "character varying(3)",
        "varchar",
        "S",
        "character varying(3) silently cuts a longer string whose excess is spaces ('abc ' is stored as "
        "'abc'); ALTER TABLE t ALTER COLUMN v TYPE text",
    ),
    (
        "string",
        "character(2)",
        "bpchar",
        "S",
        "character(2) pads strings with spaces and ignores trailing spaces ('a' and 'a ' are one value); "
        "ALTER TABLE t ALTER COLUMN v TYPE text",
    ),
    (
        "string",
        "bpchar",
        "bpchar",
        "S",
        "bpchar pads strings with spaces and ignores trailing spaces ('a' and 'a ' are one value); "
        "ALTER TABLE t ALTER COLUMN v TYPE text",
    ),
    (
        "string",
        "name",
        "name",
        "S",
        "name silently cuts strings at 63 bytes; ALTER TABLE t ALTER COLUMN v TYPE text",
    ),
    # Times: txstore never picks a time zone (point 3 of issue 24).
    (
        "timestamp",
        "timestamp without time zone",
        "timestamp",
        "D",
        "timestamp without time zone drops the instant's offset, so two instants can be one value (the two "
        "02:30 of a daylight-saving fold); ALTER TABLE t ALTER COLUMN v TYPE timestamptz",
    ),
    (
        "timestamp_ntz",
        "timestamp with time zone",
        "timestamptz",
        "D",
        "timestamp with time zone would read the wall time in the connection's TimeZone, where two wall "
        "times can be one instant (a daylight-saving gap); ALTER TABLE t ALTER COLUMN v TYPE timestamp",
    ),
    (
        "date",
        "timestamp with time zone",
        "timestamptz",
        "D",
        "timestamp with time zone would take midnight in the connection's TimeZone, where two dates can be "
        "one instant (Pacific/Apia skipped 2011-12-30); ALTER TABLE t ALTER COLUMN v TYPE date",
    ),
]


def refusal(spark: str, pg: str, why: str) -> list[str]:
    """The one problem of column v, a ``spark`` value that t.v (``pg``) cannot hold: ``why``."""
    return [f"column v: the query's v is {spark}, which t.v ({pg}) cannot hold exactly: {why}"]


@pytest.mark.parametrize(("spark", "pg", "typname", "category", "why"), ROUNDING)
def test_a_column_that_would_change_the_querys_values_is_refused_in_one_line_saying_what_to_do(
    spark: str, pg: str, typname: str, category: str, why: str
) -> None:
    assert problems_of(spark, pg, typname, category) == refusal(spark, pg, why)


@pytest.mark.parametrize(("spark", "pg", "typname", "category", "why"), ROUNDING)
def test_key_columns_are_held_to_the_same_rule(
    spark: str, pg: str, typname: str, category: str, why: str
) -> None:
    assert key_problems_of(spark, pg, typname, category) == refusal(spark, pg, why)


EXACT = [
    ("bigint", "bigint", "int8", "N"),
    ("bigint", "numeric", "numeric", "N"),
    ("bigint", "numeric(20,0)", "numeric", "N"),
    ("int", "bigint", "int8", "N"),
    ("tinyint", "smallint", "int2", "N"),
    # Too narrow for the largest values: PostgreSQL raises (integer out of range, numeric field
    # overflow) and the batch commits nothing; never a rounded number.
    ("bigint", "integer", "int4", "N"),
    ("bigint", "numeric(10,2)", "numeric", "N"),
    ("decimal(22,2)", "numeric(18,2)", "numeric", "N"),  # sum(DECIMAL(12, 2)) into the README's revenue
    ("decimal(10,3)", "numeric(12,3)", "numeric", "N"),
    ("decimal(10,3)", "numeric(12,5)", "numeric", "N"),
    ("decimal(38,18)", "numeric", "numeric", "N"),
    ("decimal(20,0)", "bigint", "int8", "N"),
    ("float", "real", "float4", "N"),
    ("float", "double precision", "float8", "N"),
    ("double", "double precision", "float8", "N"),
    ("string", "text", "text", "S"),
    ("string", "character varying", "varchar", "S"),
    ("string", "mood", "mood", "E"),
    ("string", "uuid", "uuid", "U"),
    ("string", "jsonb", "jsonb", "U"),
    ("boolean", "boolean", "bool", "B"),
    ("binary", "bytea", "bytea", "U"),
    ("timestamp", "timestamp with time zone", "timestamptz", "D"),
    ("timestamp_ntz", "timestamp without time zone", "timestamp", "D"),
    ("date", "date", "date", "D"),
    ("date", "timestamp without time zone", "timestamp", "D"),
    ("void", "real", "float4", "N"),
]


@pytest.mark.parametrize(("spark", "pg", "typname", "category"), EXACT)
def test_a_column_that_holds_every_value_exactly_is_accepted(
    spark: str, pg: str, typname: str, category: str
) -> None:
    assert problems_of(spark, pg, typname, category, "sum" if category == "N" else "replace") == []
    assert key_problems_of(spark, pg, typname, category) == []


def test_the_line_names_the_job_and_quotes_names_that_need_it() -> None:
    table = ResultsTable("Sales", ("k",), (("Orders", "sum"),), "reporting")
    table_facts = TableFacts(
        "r",
        (),
        {
            "k": Column("k", "text", "text", "S", True, False),
            "Orders": Column("Orders", "real", "float4", "N", True, False),
        },
        (UniqueIndex(("k",), True, False),),
    )
    lines = table_problems(table, table_facts, [("k", "string"), ("Orders", "bigint")], job="sales")
    assert lines == [
        "job sales: column Orders: the query's Orders is bigint, which reporting.Sales.Orders (real) cannot "
        "hold exactly: real holds integers exactly only up to 2^24 = 16777216, larger ones and sums round; "
        'ALTER TABLE reporting."Sales" ALTER COLUMN "Orders" TYPE bigint'
    ]


def test_the_catalog_gives_the_base_type_of_domains_and_every_modifier(db: psycopg.Connection) -> None:
    """Against a real catalog: a domain over numeric(10,1), a domain over that domain, a domain
    over timestamp; char, varchar(n) and negative-scale numeric columns as format_type gives them."""
    db.execute("CREATE DOMAIN amount AS numeric(10, 1)")
    db.execute("CREATE DOMAIN positive_amount AS amount CHECK (VALUE > 0)")
    db.execute("CREATE DOMAIN local_time AS timestamp")
    db.execute("CREATE DOMAIN counter AS real")
    db.execute(
        "CREATE TABLE typed (k text PRIMARY KEY, a amount, p positive_amount, at local_time, c counter, "
        "code char(2), short varchar(3), hundreds numeric(5, -2), fine numeric(12, 3), ok text)"
    )
    table = ResultsTable(
        "typed",
        ("k",),
        tuple((c, "replace") for c in ("a", "p", "at", "c", "code", "short", "hundreds", "fine", "ok")),
    )
    output = [
        ("k", "string"),
        ("a", "decimal(10,3)"),
        ("p", "decimal(10,3)"),
        ("at", "timestamp"),
        ("c", "bigint"),
        ("code", "string"),
        ("short", "string"),
        ("hundreds", "int"),
        ("fine", "decimal(10,3)"),
        ("ok", "string"),
    ]
    described = describe_table(db, table)
    assert described is not None
    assert table_problems(table, described, output, job="typed") == [
        "job typed: column a: the query's a is decimal(10,3), which typed.a (amount, a domain over "
        "numeric(10,1)) cannot hold exactly: numeric(10,1) rounds to 1 decimal place, the query's values "
        "have 3; ALTER TABLE typed ALTER COLUMN a TYPE numeric(12,3)",
        "job typed: column p: the query's p is decimal(10,3), which typed.p (positive_amount, a domain over "
        "numeric(10,1)) cannot hold exactly: numeric(10,1) rounds to 1 decimal place, the query's values "
        "have 3; ALTER TABLE typed ALTER COLUMN p TYPE numeric(12,3)",
        "job typed: column at: the query's at is timestamp, which typed.at (local_time, a domain over "
        "timestamp without time zone) cannot hold exactly: timestamp without time zone drops the instant's "
        "offset, so two instants can be one value (the two 02:30 of a daylight-saving fold); "
        "ALTER TABLE typed ALTER COLUMN at TYPE timestamptz",
        "job typed: column c: the query's c is bigint, which typed.c (counter, a domain over real) cannot "
        "hold exactly: real holds integers exactly only up to 2^24 = 16777216, larger ones and sums round; "
        "ALTER TABLE typed ALTER COLUMN c TYPE bigint",
        "job typed: column code: the query's code is string, which typed.code (character(2)) cannot hold "
        "exactly: character(2) pads strings with spaces and ignores trailing spaces ('a' and 'a ' are one "
        "value); ALTER TABLE typed ALTER COLUMN code TYPE text",
        "job typed: column short: the query's short is string, which typed.short (character varying(3)) "
        "cannot hold exactly: character varying(3) silently cuts a longer string whose excess is spaces "
        "('abc ' is stored as 'abc'); ALTER TABLE typed ALTER COLUMN short TYPE text",
        "job typed: column hundreds: the query's hundreds is int, which typed.hundreds (numeric(5,-2)) "
        "cannot hold exactly: numeric(5,-2) rounds to multiples of 100; "
        "ALTER TABLE typed ALTER COLUMN hundreds TYPE integer",
    ]

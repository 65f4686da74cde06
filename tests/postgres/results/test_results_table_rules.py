"""Results-table flags, type rules and merge SQL: plain functions, no servers."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from txstore import ResultsTable
from txstore.postgres.results.results_table import (
    merge_statement,
    parse_results_table,
    rule_problem,
    storable,
)


def test_the_flags_parse_into_a_results_table() -> None:
    table = parse_results_table("reporting.sales", "country, day", "revenue=sum,orders=SUM, last=replace")
    assert table == ResultsTable(
        "sales", ("country", "day"), (("revenue", "sum"), ("orders", "sum"), ("last", "replace")), "reporting"
    )
    assert table.columns == ("country", "day", "revenue", "orders", "last")
    assert table.ordered and table.label == "reporting.sales"
    assert table.problems() == []


@pytest.mark.parametrize(
    ("table", "key", "merge", "line"),
    [
        ("a.b.c", "k", "n=sum", "--table 'a.b.c': expected [schema.]name"),
        ('"sales"', "k", "n=sum", "--table '\"sales\"': expected [schema.]name"),
        ("sales", "k", "n", "--merge 'n': expected COL=RULE (rules: sum, min, max, replace, keep)"),
    ],
)
def test_malformed_flags_are_one_line(table: str, key: str, merge: str, line: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_results_table(table, key, merge)
    assert str(raised.value) == line


def test_a_definition_names_each_of_its_own_problems() -> None:
    table = ResultsTable("t", ("k", "k"), (("k", "sum"), ("n", "avg"), ("n", "max")))
    assert table.problems() == [
        "--key k: named twice",
        "--merge k=sum: k is a --key column; keys are not merged",
        "--merge n=avg: unknown rule 'avg'; rules: sum, min, max, replace, keep",
        "--merge n: named twice",
    ]


def test_a_sqlalchemy_table_gives_its_name_and_schema() -> None:
    t = sa.Table("sales", sa.MetaData(schema="reporting"), sa.Column("country", sa.Text, primary_key=True))
    assert ResultsTable.of(t, ["country"], {"revenue": "sum"}) == ResultsTable(
        "sales", ("country",), (("revenue", "sum"),), "reporting"
    )


@pytest.mark.parametrize(
    ("spark", "pg", "category", "ok"),
    [
        ("bigint", "int8", "N", True),
        ("int", "numeric", "N", True),
        ("decimal(20,2)", "numeric", "N", True),
        ("decimal(20,2)", "int8", "N", False),
        ("decimal(20,0)", "int8", "N", True),
        ("decimal(20,2)", "float8", "N", False),
        ("double", "numeric", "N", False),
        ("double", "float8", "N", True),
        ("string", "text", "S", True),
        ("string", "uuid", "U", True),
        ("string", "int8", "N", False),
        ("timestamp", "timestamptz", "D", True),
        ("timestamp", "date", "D", False),
        ("date", "timestamptz", "D", True),
        ("binary", "bytea", "U", True),
        ("boolean", "bool", "B", True),
        ("array<int>", "int4", "N", False),
        ("void", "text", "S", True),
    ],
)
def test_which_spark_types_a_column_can_hold(spark: str, pg: str, category: str, ok: bool) -> None:
    assert storable(spark, pg, category) is ok


def test_sum_needs_numbers_and_min_max_an_order() -> None:
    assert rule_problem("sum", "text", "S") == "sum needs a number column"
    assert rule_problem("sum", "numeric", "N") is None
    assert rule_problem("max", "bool", "B") == "max needs an ordered type (PostgreSQL has no max() for bool)"
    assert rule_problem("keep", "bool", "B") is None


def test_the_merge_statement_orders_rows_by_key_and_treats_null_as_no_value() -> None:
    table = ResultsTable("t", ("k",), (("s", "sum"), ("lo", "min"), ("r", "replace"), ("f", "keep")), "x")
    plain = merge_statement(table, grouped=False).as_string(None)
    assert plain == (
        'INSERT INTO "x"."t" AS t ("k", "s", "lo", "r", "f") SELECT "k", "s", "lo", "r", "f" '
        'FROM "txstore_batch_rows" ORDER BY "k" ON CONFLICT ("k") DO UPDATE SET '
        '"s" = coalesce(t."s" + EXCLUDED."s", t."s", EXCLUDED."s"), "lo" = least(t."lo", EXCLUDED."lo"), '
        '"r" = coalesce(EXCLUDED."r", t."r"), "f" = coalesce(t."f", EXCLUDED."f")'
    )
    grouped = merge_statement(table).as_string(None)
    assert (
        'SELECT "k", sum("s"), min("lo"), '
        '(array_agg("r" ORDER BY "txstore row" DESC) FILTER (WHERE "r" IS NOT NULL))[1], '
        '(array_agg("f" ORDER BY "txstore row" ASC) FILTER (WHERE "f" IS NOT NULL))[1] '
        'FROM "txstore_batch_rows" GROUP BY "k" ORDER BY "k"'
    ) in grouped

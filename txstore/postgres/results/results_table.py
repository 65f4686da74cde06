"""A results table of the user's own: which table, which key, how each column merges.

Pure: parsing the ``--table``/``--key``/``--merge`` flags (or a SQLAlchemy
``Table``) into a :class:`ResultsTable`, which Spark types a PostgreSQL
column can hold, and the SQL of a batch's commit
(:mod:`txstore.modes.results_table` runs it, :mod:`txstore.postgres.results.results_check`
checks the table before the first batch).

A batch's rows are copied into a temporary table, then merged by one
statement::

    INSERT INTO t AS t (keys, cols)
    SELECT keys, <pre-merge of each col> FROM tmp GROUP BY keys ORDER BY keys
    ON CONFLICT (keys) DO UPDATE SET col = <rule(t.col, EXCLUDED.col)>

Rows with the same key within one batch are first combined by the same
rule (``GROUP BY``; for ``replace`` and ``keep`` the last and the first
in the query's output order), because ``ON CONFLICT`` cannot update one
row twice in a statement. Most queries group by the key themselves, so the
rows are first merged as they are, and grouped only if a key comes twice. ``ORDER BY keys`` locks rows in one order in
every transaction, so concurrent jobs merging into the same rows wait for
each other instead of deadlocking.

NULL means "no value" for every rule, as in SQL's aggregates: ``sum``
adds the values that are there, ``min``/``max`` ignore NULL
(``LEAST``/``GREATEST``), ``replace`` takes the new value unless it is
NULL, ``keep`` keeps the stored value unless it is NULL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

SUM, MIN, MAX, REPLACE, KEEP = "sum", "min", "max", "replace", "keep"
MERGE_RULES = (SUM, MIN, MAX, REPLACE, KEEP)
ORDERED_RULES = (REPLACE, KEEP)  # need the rows' order within a batch

ROW_ORDER = "txstore row"
"""The temporary table's column holding each row's position in the query's output (``replace``/``keep``)."""
TEMP_TABLE = "txstore_batch_rows"

_PLAIN_NAME = re.compile(r"^[^.\s\"]+$")


@dataclass(frozen=True)
class ResultsTable:
    """Where a batch's rows go: ``schema.name`` (schema None: the search path), the key columns
    (a primary key or unique constraint over exactly them) and each other column's merge rule."""

    name: str
    keys: tuple[str, ...]
    merge: tuple[tuple[str, str], ...]
    schema: str | None = None

    @classmethod
    def of(
        cls, table: Any, keys: Sequence[str], merge: Mapping[str, str] | Iterable[tuple[str, str]]
    ) -> ResultsTable:
        """From a SQLAlchemy ``Table`` (its name and schema), key column names and ``{column: rule}``."""
        items = tuple(merge.items()) if isinstance(merge, Mapping) else tuple(merge)
        return cls(str(table.name), tuple(keys), items, table.schema)

    @property
    def label(self) -> str:
        """``schema.name`` as the user wrote it, for error lines."""
        return f"{self.schema}.{self.name}" if self.schema else self.name

    @property
    def columns(self) -> tuple[str, ...]:
        """Keys first, then merged columns: the order rows are copied in."""
        return self.keys + tuple(c for c, _ in self.merge)

    @property
    def rules(self) -> dict[str, str]:
        return dict(self.merge)

    @property
    def ordered(self) -> bool:
        """Whether rows carry their output position (some rule depends on the order)."""
        return any(rule in ORDERED_RULES for _, rule in self.merge)

    def problems(self) -> list[str]:
        """What is wrong with the definition itself, one line each (no database needed)."""
        out: list[str] = []
        if not self.name:
            out.append("--table: give the results table's name, [schema.]name")
        if not self.keys:
            out.append(f"--key: give the key column(s) of {self.label}, COL[,COL...]")
        seen: set[str] = set()
        for column in self.keys:
            if column in seen:
                out.append(f"--key {column}: named twice")
            seen.add(column)
        for column, rule in self.merge:
            if column in self.keys:
                out.append(f"--merge {column}={rule}: {column} is a --key column; keys are not merged")
            elif column in seen:
                out.append(f"--merge {column}: named twice")
            seen.add(column)
            if rule not in MERGE_RULES:
                out.append(f"--merge {column}={rule}: unknown rule {rule!r}; rules: {', '.join(MERGE_RULES)}")
        if not self.merge:
            out.append(
                f"--merge: give a rule for each column of {self.label} the query fills, COL=RULE[,...]"
            )
        return out


def parse_table_name(text: str) -> tuple[str | None, str]:
    """``name`` or ``schema.name`` -> (schema or None, name). Names are taken as written (no quoting)."""
    parts = [p.strip() for p in text.strip().split(".")]
    if len(parts) > 2 or not all(parts) or not all(_PLAIN_NAME.match(p) for p in parts):
        raise ValueError(f"--table {text!r}: expected [schema.]name")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def parse_columns(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def parse_merge(text: str) -> tuple[tuple[str, str], ...]:
    """``revenue=sum,orders=sum`` -> (("revenue", "sum"), ("orders", "sum")); rules lower-cased."""
    out: list[tuple[str, str]] = []
    for item in text.split(","):
        if not item.strip():
            continue
        column, sep, rule = item.partition("=")
        if not sep or not column.strip():
            raise ValueError(f"--merge {item.strip()!r}: expected COL=RULE (rules: {', '.join(MERGE_RULES)})")
        out.append((column.strip(), rule.strip().lower()))
    return tuple(out)


def parse_results_table(table: str, keys: str, merge: str) -> ResultsTable:
    """The flags as a :class:`ResultsTable`; malformed text raises ``ValueError`` with one line."""
    schema, name = parse_table_name(table)
    return ResultsTable(name, parse_columns(keys), parse_merge(merge), schema)


# -- which Spark types a column can hold ---------------------------------------------------
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_STRING_TARGETS = ("uuid", "json", "jsonb", "xml", "inet", "cidr", "macaddr", "citext")
_INTEGER_COLUMNS = ("int2", "int4", "int8")
_FLOAT_COLUMNS = ("float4", "float8")


def storable(spark_type: str, pg_type: str, category: str) -> bool:
    """Whether values of ``spark_type`` (Spark's ``simpleString``) go into a column of ``pg_type``
    (``pg_type.typname``, of ``typcategory`` ``category``) without being changed.

    Exact numbers never go into floating-point columns; timestamps into ``timestamp`` or
    ``timestamptz``; strings into text-like, enum, uuid and JSON columns.
    """
    if spark_type in ("void", "null"):
        return True  # the NULL literal
    if spark_type in _INTEGRAL:
        return category == "N" and pg_type != "money"
    if spark_type.startswith("decimal"):
        scale = re.search(r",\s*(\d+)\)", spark_type)
        whole = scale is not None and scale.group(1) == "0"
        return pg_type == "numeric" or (whole and pg_type in _INTEGER_COLUMNS)
    if spark_type in ("float", "double"):
        return pg_type in _FLOAT_COLUMNS  # never into numeric: the binary fraction is not the decimal
    if spark_type == "string":
        return category in ("S", "E") or pg_type in _STRING_TARGETS
    if spark_type == "boolean":
        return pg_type == "bool"
    if spark_type in ("timestamp", "timestamp_ntz"):
        return pg_type in ("timestamptz", "timestamp")
    if spark_type == "date":
        return pg_type in ("date", "timestamp", "timestamptz")
    if spark_type == "binary":
        return pg_type == "bytea"
    return False


def rule_problem(rule: str, pg_type: str, category: str) -> str | None:
    """Why ``rule`` cannot merge a column of this type (None: it can)."""
    if rule == SUM and (category != "N" or pg_type == "money"):
        return "sum needs a number column"
    if rule in (MIN, MAX) and pg_type in ("bool", "json", "xml", "uuid"):
        return f"{rule} needs an ordered type (PostgreSQL has no {rule}() for {pg_type})"
    return None


# -- the commit's SQL ----------------------------------------------------------------------
def table_identifier(table: ResultsTable) -> sql.Identifier:
    return sql.Identifier(table.schema, table.name) if table.schema else sql.Identifier(table.name)


def create_temp_table(table: ResultsTable, types: Mapping[str, str]) -> sql.Composed:
    """The batch's rows' table (``types``: each column's type and collation, as
    :func:`txstore.postgres.results.results_merge.temp_table_types` gives them), dropped at commit."""
    columns = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in table.columns]
    if table.ordered:
        columns.append(sql.SQL("{} bigint").format(sql.Identifier(ROW_ORDER)))
    return sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
        sql.Identifier(TEMP_TABLE), sql.SQL(", ").join(columns)
    )


def copy_rows(table: ResultsTable) -> sql.Composed:
    names = [*table.columns, ROW_ORDER] if table.ordered else list(table.columns)
    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(TEMP_TABLE), sql.SQL(", ").join(map(sql.Identifier, names))
    )


def _pre_merge(column: str, rule: str) -> sql.Composable:
    """How one batch's rows with the same key combine into one (same rule, same NULL handling)."""
    c = sql.Identifier(column)
    if rule in (SUM, MIN, MAX):
        return sql.SQL(rule + "({})").format(c)
    direction = sql.SQL("DESC" if rule == REPLACE else "ASC")
    return sql.SQL("(array_agg({c} ORDER BY {o} {d}) FILTER (WHERE {c} IS NOT NULL))[1]").format(
        c=c, o=sql.Identifier(ROW_ORDER), d=direction
    )


def _merged(column: str, rule: str) -> sql.Composable:
    """The stored value merged with the batch's (``t`` the stored row, ``EXCLUDED`` the new)."""
    c = sql.Identifier(column)
    template = {
        SUM: "coalesce(t.{c} + EXCLUDED.{c}, t.{c}, EXCLUDED.{c})",
        MIN: "least(t.{c}, EXCLUDED.{c})",
        MAX: "greatest(t.{c}, EXCLUDED.{c})",
        REPLACE: "coalesce(EXCLUDED.{c}, t.{c})",
        KEEP: "coalesce(t.{c}, EXCLUDED.{c})",
    }[rule]
    return sql.SQL("{c} = " + template).format(c=c)


def merge_statement(table: ResultsTable, grouped: bool = True) -> sql.Composed:
    """One statement merging the temporary table into the results table, rows in key order.

    ``grouped`` False: the rows as they are, for a batch with one row per key (a row twice
    fails the statement with a cardinality violation; run it grouped then).
    """
    keys = sql.SQL(", ").join(map(sql.Identifier, table.keys))
    if grouped:
        rows = sql.SQL("SELECT {keys}, {pre} FROM {tmp} GROUP BY {keys} ORDER BY {keys}")
    else:
        rows = sql.SQL("SELECT {columns} FROM {tmp} ORDER BY {keys}")
    columns = sql.SQL(", ").join(map(sql.Identifier, table.columns))
    return sql.SQL(
        "INSERT INTO {t} AS t ({columns}) {rows} ON CONFLICT ({keys}) DO UPDATE SET {merged}"
    ).format(
        t=table_identifier(table),
        columns=columns,
        rows=rows.format(
            keys=keys,
            columns=columns,
            pre=sql.SQL(", ").join(_pre_merge(c, r) for c, r in table.merge),
            tmp=sql.Identifier(TEMP_TABLE),
        ),
        keys=keys,
        merged=sql.SQL(", ").join(_merged(c, r) for c, r in table.merge),
    )

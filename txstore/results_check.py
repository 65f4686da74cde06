"""Checking a results table before the first batch reads anything.

:func:`describe_table` reads what PostgreSQL knows of the table (one
round trip per catalog question); :func:`table_problems` compares it with
the :class:`~txstore.results_table.ResultsTable` and the query's output
columns, and returns every problem as one line naming its column. The job
refuses to start on any (:class:`~txstore.errors.ResultsTableInvalid`,
exit 2), so nothing is read from Kafka or written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from txstore.results_table import ResultsTable, rule_problem, storable, table_identifier

PRIVILEGES = ("SELECT", "INSERT", "UPDATE")
"""What the job's role needs on the table: INSERT ... ON CONFLICT DO UPDATE reads the stored values."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type(): the declared type, e.g. numeric(12,2)
    typname: str  # pg_type.typname of the base type, e.g. numeric
    category: str  # pg_type.typcategory: N numbers, S strings, D date/time, ...
    not_null: bool
    generated: bool


@dataclass(frozen=True)
class UniqueIndex:
    columns: tuple[str, ...]
    primary: bool
    nulls_not_distinct: bool

    def describe(self) -> str:
        kind = "primary key" if self.primary else "unique"
        return f"{kind} ({', '.join(self.columns)})"


@dataclass(frozen=True)
class TableFacts:
    kind: str  # pg_class.relkind
    missing_privileges: tuple[str, ...]
    columns: dict[str, Column]
    unique: tuple[UniqueIndex, ...]


def describe_table(conn: psycopg.Connection, table: ResultsTable) -> TableFacts | None:
    """What the catalog says about the table (None: no such table), in one read-only transaction."""
    qualified = table_identifier(table).as_string(conn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)::oid", (qualified,))
            row = cur.fetchone()
            oid = row[0] if row else None
            if oid is None:
                return None
            cur.execute(
                "SELECT relkind::text, "
                + ", ".join(f"has_table_privilege(%(oid)s::oid, '{p}')" for p in PRIVILEGES)
                + " FROM pg_class WHERE oid = %(oid)s",
                {"oid": oid},
            )
            kind, *granted = cur.fetchone() or ("?",)
            cur.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), "
                "coalesce(b.typname, t.typname), coalesce(b.typcategory, t.typcategory)::text, "
                "a.attnotnull, a.attgenerated <> '' "
                "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                "LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype "
                "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                (oid,),
            )
            columns = {name: Column(name, *rest) for name, *rest in cur.fetchall()}
            nulls = "i.indnullsnotdistinct" if conn.info.server_version >= 150000 else "false"
            cur.execute(
                f"SELECT array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(n, o) "
                f"JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)::text[], "
                f"i.indisprimary, {nulls} FROM pg_index i "
                f"WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
                f"AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY NOT i.indisprimary, i.indexrelid",
                (oid,),
            )
            unique = tuple(UniqueIndex(tuple(cols), primary, nnd) for cols, primary, nnd in cur.fetchall())
    finally:
        conn.rollback()
    missing = tuple(p for p, ok in zip(PRIVILEGES, granted, strict=True) if not ok)
    return TableFacts(kind, missing, columns, unique)


def table_problems(
    table: ResultsTable,
    facts: TableFacts | None,
    output: Sequence[tuple[str, str]],
    role: str = "the job's role",
) -> list[str]:
    """Every problem, one line each naming its column; none means the job may start.

    ``output``: the query's columns as (name, Spark ``simpleString``) pairs.
    """
    problems = table.problems()
    label = table.label
    if facts is None:
        return [
            *problems,
            f"--table {label}: no such table (txstore never creates it: create it with your own "
            "migration, or check the name and schema)",
        ]
    if facts.kind not in ("r", "p"):
        problems.append(f"--table {label}: not a table (relkind {facts.kind}); give a table to merge into")
    if facts.missing_privileges:
        problems.append(
            f"--table {label}: {role} lacks {', '.join(facts.missing_privileges)} on it "
            f"(GRANT {', '.join(PRIVILEGES)} ON {label} TO ...)"
        )
    types = dict(output)
    rules = table.rules
    for key in table.keys:
        if key not in facts.columns:
            problems.append(f"--key {key}: {label} has no column {key}")
        if key not in types:
            problems.append(f"--key {key}: the query has no column {key} (it has {_names(output)})")
    for merged, rule in table.merge:
        if merged not in facts.columns:
            problems.append(f"--merge {merged}={rule}: {label} has no column {merged}")
        if merged not in types:
            problems.append(
                f"--merge {merged}={rule}: the query has no column {merged} (it has {_names(output)})"
            )
    for name, _ in output:
        if name not in table.keys and name not in rules:
            problems.append(
                f"query column {name}: neither a --key nor in --merge; give its rule (--merge {name}=sum, "
                "min, max, replace or keep) or leave it out of the query"
            )
    for name, spark_type in output:
        column = facts.columns.get(name)
        if column is None or (name not in table.keys and name not in rules):
            continue
        if column.generated:
            problems.append(f"column {name}: {label}.{name} is a generated column; it cannot be written")
        elif not storable(spark_type, column.typname, column.category):
            problems.append(
                f"column {name}: the query's {name} is {spark_type}, which {label}.{name} ({column.type}) "
                f"cannot hold; cast it in the query or change the column"
            )
        merge_rule = rules.get(name)
        problem = rule_problem(merge_rule, column.typname, column.category) if merge_rule else None
        if problem:
            problems.append(f"--merge {name}={merge_rule}: {label}.{name} is {column.type}; {problem}")
    if table.keys and all(k in facts.columns for k in table.keys):
        problems += _key_problems(table, facts)
    return problems


def _key_problems(table: ResultsTable, facts: TableFacts) -> list[str]:
    keys = ",".join(table.keys)
    match = next((u for u in facts.unique if set(u.columns) == set(table.keys)), None)
    if match is None:
        has = "; ".join(u.describe() for u in facts.unique) or "none"
        return [
            f"--key {keys}: {table.label} has no primary key or unique constraint over exactly "
            f"({', '.join(table.keys)}) (it has: {has}); rows could not be merged by key"
        ]
    if match.nulls_not_distinct:
        return []
    return [
        f"--key {keys}: key column {c} of {table.label} may be NULL and its unique constraint treats NULLs "
        "as distinct, so rows with a NULL key would never merge; make it NOT NULL (or the constraint "
        "UNIQUE NULLS NOT DISTINCT)"
        for c in table.keys
        if not facts.columns[c].not_null
    ]


def _names(output: Sequence[tuple[str, str]]) -> str:
    return ", ".join(name for name, _ in output) or "no columns"

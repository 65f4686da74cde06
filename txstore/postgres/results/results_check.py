"""Checking a results table before the first batch reads anything.

:func:`describe_table` reads what PostgreSQL knows of the table (one
round trip per catalog question); :func:`table_problems` compares it with
the :class:`~txstore.postgres.results.results_table.ResultsTable` and the query's output
columns, and returns every problem as one line naming its column. The job
refuses to start on any (:class:`~txstore.core.errors.ResultsTableInvalid`,
exit 2), so nothing is read from Kafka or written.

Exact columns (issue 24). Beyond :func:`~txstore.postgres.results.results_table.storable` (which
kinds of column a Spark type can go into at all), :func:`inexact` refuses a
column that cannot hold every value of the query's type *as it is*: whatever
PostgreSQL would round, cut, pad or put into a time zone it guessed, because
that is silent: a counter summed in ``real`` stops at 2^24, two keys become
one row. The rules, the same for key columns and merged columns (a value
changed is as wrong as two keys merged):

- integers (``tinyint`` ... ``bigint``) only into ``smallint``, ``integer``,
  ``bigint`` and ``numeric`` (no negative scale: ``numeric(5,-2)`` rounds to
  hundreds); never into ``real``/``double precision`` (exact up to 2^24 and
  2^53 only, and sums round), nor ``oid`` and the ``reg*`` types (``-1`` is
  stored as 4294967295).
- ``decimal(p,s)`` into ``numeric(P,S)`` only when ``S >= s`` (else rounded to
  S places); into ``numeric`` without a modifier always; into integer
  columns only when ``s = 0`` (``storable``).
- Too narrow, not rounding: an integer column narrower than the query's
  (``integer`` for Spark's ``bigint`` count) and ``numeric(P,S)`` with fewer
  whole digits than ``p - s`` (``numeric(18,2)`` for ``sum`` of
  ``DECIMAL(12, 2)``, a ``decimal(22,2)``) are **accepted**: a value or a sum
  they cannot hold makes PostgreSQL raise (``integer out of range``,
  ``numeric field overflow``), the batch's transaction rolls back and the job
  stops with that error, nothing merged and no offset moved. That is loud,
  never a wrong number, and refusing it would refuse every ``integer`` count
  column and the README's own ``numeric(18,2)`` revenue.
- ``float`` into ``real`` or ``double precision``, ``double`` only into
  ``double precision`` (``real`` rounds a double). Floats are inexact by
  nature; they never go into ``numeric`` (``storable``: the binary fraction is
  not the decimal), and their text is the shortest that reads back as the same
  float.
- ``string`` into ``text``, ``varchar`` without a length, enums, and the
  typed columns ``storable`` names (``uuid``, ``json``, ``jsonb``, ``inet``,
  ``citext``, ...: the string is parsed; the column's type decides which
  strings are one value, e.g. ``citext`` keys ignore case, as its owner chose;
  a string that does not parse raises). Refused: ``char(n)``/``bpchar`` (pads
  with spaces and ignores trailing spaces: ``'a'`` and ``'a '`` are one key),
  ``varchar(n)`` (a longer string whose excess is spaces is cut without an
  error: ``'abc '`` is stored as ``'abc'``; any other too long string raises)
  and ``name`` (cut at 63 bytes).
- times: txstore never picks a time zone. Spark's ``timestamp`` (an instant)
  only into ``timestamptz``: ``timestamp`` without time zone drops the offset,
  so the two 02:30 of a daylight-saving fold would be one key (the instants are
  written as UTC text, :mod:`txstore.postgres.results.copy_text`). ``timestamp_ntz`` (a wall
  time) only into ``timestamp``, and ``date`` into ``date`` or ``timestamp``:
  into ``timestamptz`` PostgreSQL would place them in the connection's
  ``TimeZone``, where a daylight-saving gap makes two wall times one instant
  (and Pacific/Apia's skipped 2011-12-30 two dates one midnight).
- ``boolean`` only into ``boolean``, ``binary`` only into ``bytea``
  (``storable``).

The merge rules add no rounding of their own: ``sum`` of values with at most S
decimal places has at most S, ``min``/``max``/``replace``/``keep`` pick one of
the values; ``rule_problem`` refuses rules a column's type cannot take.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from txstore.postgres.results.results_table import ResultsTable, rule_problem, storable, table_identifier

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
    # A domain's base type with the modifier it carries (format_type), e.g. numeric(10,1); "": no domain.
    base: str = ""

    @property
    def declared(self) -> str:
        """The type that holds the values: the base type of a domain, else the column's own."""
        return self.base or self.type

    def describe(self) -> str:
        return f"{self.type}, a domain over {self.base}" if self.base else self.type


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


COLUMNS = """
WITH RECURSIVE base (attnum, typ, typmod, depth) AS (
    SELECT a.attnum, a.atttypid, a.atttypmod, 0 FROM pg_attribute a
    WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT base.attnum, t.typbasetype, CASE WHEN base.typmod = -1 THEN t.typtypmod ELSE base.typmod END,
           base.depth + 1
    FROM base JOIN pg_type t ON t.oid = base.typ WHERE t.typtype = 'd'
)
SELECT a.attname, format_type(a.atttypid, a.atttypmod), b.typname, b.typcategory::text,
       a.attnotnull, a.attgenerated <> '',
       CASE WHEN base.depth > 0 THEN format_type(base.typ, base.typmod) ELSE '' END
FROM pg_attribute a
JOIN base ON base.attnum = a.attnum
JOIN pg_type b ON b.oid = base.typ AND b.typtype <> 'd'
WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
"""Each column: name, declared type, its base type's name and category (through domains over
domains), NOT NULL, generated, and a domain's base type with the modifier it carries."""


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
            cur.execute(COLUMNS, {"oid": oid})
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
    job: str | None = None,
) -> list[str]:
    """Every problem, one line each naming its column; none means the job may start.

    ``output``: the query's columns as (name, Spark ``simpleString``) pairs; ``job`` names the
    job in the lines of columns that cannot hold the query's values exactly (:func:`inexact`).
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
        elif unfit := inexact(spark_type, column):
            why, fix = unfit
            problems.append(
                f"{f'job {job}: ' if job else ''}column {name}: the query's {name} is {spark_type}, which "
                f"{label}.{name} ({column.describe()}) cannot hold exactly: {why}; "
                f"ALTER TABLE {_qualified(table)} ALTER COLUMN {_quoted(name)} TYPE {fix}"
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


# -- columns that hold every value exactly (see the module docstring) ------------------------
_SPARK_INTEGERS = {"tinyint": "smallint", "smallint": "smallint", "int": "integer", "bigint": "bigint"}
_FLOATS = {"float4": ("real", 24), "float8": ("double precision", 53)}
_NUMERIC = re.compile(r"^numeric\((\d+),(-?\d+)\)$")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_LENGTH = re.compile(r"\((\d+)\)$")
_MAX_NUMERIC_PRECISION = 1000


def inexact(spark_type: str, column: Column) -> tuple[str, str] | None:
    """Why ``column`` cannot hold every value of ``spark_type`` (Spark's ``simpleString``) exactly,
    and the column type that would: ``(why, type)``; None when it can. Only asked of columns
    :func:`~txstore.postgres.results.results_table.storable` lets the type into; the rules are the module's."""
    typname, declared = column.typname, column.declared
    if spark_type in _SPARK_INTEGERS:
        return _inexact_integer(typname, declared, _SPARK_INTEGERS[spark_type])
    decimal = _DECIMAL.match(spark_type)
    if decimal:
        return _inexact_decimal(typname, declared, int(decimal.group(1)), int(decimal.group(2)))
    if spark_type == "double" and typname == "float4":
        return "real keeps 24 bits of a double's 53, so doubles round", "double precision"
    if spark_type == "string":
        return _inexact_string(typname, declared)
    if spark_type == "timestamp" and typname == "timestamp":
        return (
            f"{declared} drops the instant's offset, so two instants can be one value "
            "(the two 02:30 of a daylight-saving fold)",
            "timestamptz",
        )
    if spark_type == "timestamp_ntz" and typname == "timestamptz":
        return (
            f"{declared} would read the wall time in the connection's TimeZone, where two wall times "
            "can be one instant (a daylight-saving gap)",
            "timestamp",
        )
    if spark_type == "date" and typname == "timestamptz":
        return (
            f"{declared} would take midnight in the connection's TimeZone, where two dates can be one "
            "instant (Pacific/Apia skipped 2011-12-30)",
            "date",
        )
    return None


def _inexact_integer(typname: str, declared: str, fix: str) -> tuple[str, str] | None:
    if typname in ("int2", "int4", "int8"):
        return None  # narrower ones overflow with an error, never round (module docstring)
    if typname in _FLOATS:
        name, bits = _FLOATS[typname]
        return (
            f"{name} holds integers exactly only up to 2^{bits} = {2**bits}, larger ones and sums round",
            fix,
        )
    if typname == "numeric":
        numeric = _NUMERIC.match(declared)
        if numeric and int(numeric.group(2)) < 0:
            return _rounds(declared, int(numeric.group(2))), fix
        return None
    return "only integer and numeric columns hold integers exactly", fix


def _inexact_decimal(typname: str, declared: str, precision: int, scale: int) -> tuple[str, str] | None:
    numeric = _NUMERIC.match(declared) if typname == "numeric" else None
    if numeric is None:
        return None  # numeric without a modifier; integer columns take scale 0 only (storable)
    p, s = int(numeric.group(1)), int(numeric.group(2))
    if s >= scale:
        return None  # fewer whole digits overflow with an error, never round (module docstring)
    whole = max(p - s, precision - scale)
    why = _rounds(declared, s) if s < 0 else f"{_rounds(declared, s)}, the query's values have {scale}"
    return why, f"numeric({min(whole + scale, _MAX_NUMERIC_PRECISION)},{scale})"


def _rounds(declared: str, scale: int) -> str:
    if scale < 0:
        return f"{declared} rounds to multiples of {10**-scale}"
    return f"{declared} rounds to {scale} decimal place{'' if scale == 1 else 's'}"


def _inexact_string(typname: str, declared: str) -> tuple[str, str] | None:
    if typname == "bpchar":
        return (
            f"{declared} pads strings with spaces and ignores trailing spaces ('a' and 'a ' are one value)",
            "text",
        )
    if typname == "name":
        return "name silently cuts strings at 63 bytes", "text"
    length = _LENGTH.search(declared) if typname == "varchar" else None
    if length:
        n = int(length.group(1))
        word = "abcdefgh"[:n]
        example = (
            f"'{word} ' is stored as '{word}'"
            if n <= len("abcdefgh")
            else f"{n} characters and a space are stored without the space"
        )
        return f"{declared} silently cuts a longer string whose excess is spaces ({example})", "text"
    return None


# PostgreSQL's reserved keywords (and those that may not name a column): quoted in ALTER TABLE.
_KEYWORD_TEXT = (
    "all analyse analyze and any array as asc asymmetric authorization binary both case cast check "
    "collate collation column concurrently constraint create cross current_catalog current_date "
    "current_role current_schema current_time current_timestamp current_user default deferrable desc "
    "distinct do else end except false fetch for foreign freeze from full grant group having ilike in "
    "initially inner intersect into is isnull join lateral leading left like limit localtime "
    "localtimestamp natural not notnull null offset on only or order outer overlaps placing primary "
    "references returning right select session_user similar some symmetric table tablesample then to "
    "trailing true union unique user using variadic verbose when where window with"
)
_KEYWORDS = frozenset(_KEYWORD_TEXT.split())
_PLAIN = re.compile(r"^[a-z_][a-z0-9_$]*$")


def _quoted(name: str) -> str:
    """``name`` as SQL: as it is when PostgreSQL would read it back the same, else double-quoted."""
    if _PLAIN.match(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def _qualified(table: ResultsTable) -> str:
    return f"{_quoted(table.schema)}.{_quoted(table.name)}" if table.schema else _quoted(table.name)

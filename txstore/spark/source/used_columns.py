"""The Kafka-source columns a DataFrame aggregate uses, from Spark's optimized plan.

A ``dataframe_aggregate`` that declares no ``read_columns`` would have every
Kafka-source column built in Python and handed to Spark, although most
aggregates use two or three of them: a Python reader is opaque to Spark, so
Spark cannot prune its columns itself. Building keys, values, timestamps and
headers costs about 1 us a message (``txstore.spark.source.arrow``), and a count per topic
needs none of them. So, once per job, before the first batch:

1. the aggregate is applied to a frame of the same shape as a batch's (a
   ``mapInArrow`` with every Kafka-source column, over ``spark.range``) that
   is never run;
2. Spark explains it (``explain(extended=True)``: classic and Connect alike;
   no Spark job): its optimizer prunes every column the query does not
   need, and the optimized plan names each column still used by its id
   (``topic#4``);
3. :func:`columns_in_plan` reads the ids of the ``mapInArrow``'s output
   from that plan and keeps each column whose id is used anywhere else;
4. :func:`infer_read_columns` checks the result: the aggregate given a
   frame of only those columns (selected above the same source) must make
   exactly the same optimized plan, ids aside, or nothing is inferred. So
   an aggregate whose Python code looks at ``frame.columns`` and builds
   another query from fewer of them is read with all of them; the same
   plan over the same data gives the same rows.

Why the optimizer and not analysis alone: dropping a column changes a
``distinct()`` without any error, while the optimizer keeps every column a
``distinct()`` compares. Why it is safe to read text: a column is kept as
soon as its id appears anywhere in the plan, so a misread can only keep
columns, never drop one; a plan Spark shortened (``... N more fields``),
or with no ``mapInArrow`` of the Kafka-source columns, infers nothing (all
columns are read, as before). A job that declares ``read_columns`` is
never inferred for: declare all of them to turn this off.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from txstore.core.errors import first_line
from txstore.spark.source.probing import quiet_analysis_errors
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, kafka_source_schema

OPTIMIZED_SECTION = "== Optimized Logical Plan =="
_SHORTENED = ("more fields", "more characters", "[truncated]")
_ATTRIBUTE = re.compile(r"\b([A-Za-z_]\w*)#(\d+)L?\b")
_IDS = re.compile(r"#\d+L?\b")


@dataclass(frozen=True)
class Inferred:
    """What :func:`infer_read_columns` found: the columns to read (None: all of them) and why."""

    columns: tuple[str, ...] | None
    reason: str


def optimized_section(explained: str) -> str | None:
    """The optimized logical plan of an ``explain(extended=True)`` text, or None if it has none."""
    start = explained.find(OPTIMIZED_SECTION)
    if start < 0:
        return None
    body = explained[start + len(OPTIMIZED_SECTION) :]
    end = body.find("\n== ")
    return body if end < 0 else body[:end]


def columns_in_plan(plan: str) -> tuple[str, ...] | None:
    """The Kafka-source columns an optimized logical plan uses, in the source's order; None
    when the plan cannot tell (shortened, or no ``MapInArrow`` line of the Kafka-source columns).

    Steps: each ``MapInArrow`` line whose output names every Kafka-source
    column once gives those columns' ids; a column is used when one of its ids
    appears on any other line of the plan (a join of the batch with itself
    has two such lines, with ids of their own).
    """
    if any(marker in plan for marker in _SHORTENED):
        return None
    lines = plan.splitlines()
    ids: dict[str, str] = {}  # attribute id -> column
    source_lines = set()
    for number, line in enumerate(lines):
        if "MapInArrow" not in line:
            continue
        found = [(name, i) for name, i in _ATTRIBUTE.findall(line) if name in KAFKA_SOURCE_COLUMNS]
        names = [name for name, _ in found]
        if sorted(names) != sorted(KAFKA_SOURCE_COLUMNS):
            continue
        source_lines.add(number)
        ids.update({i: name for name, i in found})
    if not ids:
        return None
    used = {
        ids[i]
        for number, line in enumerate(lines)
        if number not in source_lines
        for _, i in _ATTRIBUTE.findall(line)
        if i in ids
    }
    return tuple(c for c in KAFKA_SOURCE_COLUMNS if c in used)


def _no_rows(batches: Iterable[Any]) -> Iterator[Any]:
    """The probe frame's function: never run (the frame is only explained)."""
    yield from ()


def probe_frame(spark: Any, schema: Any) -> Any:
    """A frame of ``schema`` shaped like a batch's (a ``mapInArrow`` over ``spark.range``), only
    ever explained or analysed: its function never runs."""
    return spark.range(0, 1, 1, 1).mapInArrow(_no_rows, schema)


def explained_plan(spark: Any, aggregate: Callable[[Any], Any], columns: Sequence[str] | None = None) -> str:
    """``explain(extended=True)`` of ``aggregate`` over a batch-shaped frame with every
    Kafka-source column, or only ``columns`` of it (selected above the source). Nothing runs."""
    frame = probe_frame(spark, kafka_source_schema())
    if columns is not None:
        frame = frame.select(*columns)
    return explain_string(aggregate(frame))


def explain_string(frame: Any) -> str:
    """What ``frame.explain(extended=True)`` prints, returned instead of printed.

    ``explain`` prints, and capturing that by swapping ``sys.stdout`` swaps it for the whole
    process: jobs probing in threads of one process would read each other's plans. So the
    text is asked for where ``explain`` gets it: the Connect client's explain string, or on
    classic the JVM's explain string of the frame's query execution (both since PySpark 3.4,
    unchanged through 4.3).
    """
    if hasattr(type(frame), "_explain_string"):  # the class: a classic frame's attributes are columns
        return str(frame._explain_string(extended=True))
    jvm = frame.sparkSession._jvm
    return str(jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "extended"))


def _without_ids(plan: str) -> str:
    return _IDS.sub("#", plan)


def infer_read_columns(spark: Any, aggregate: Callable[[Any], Any]) -> Inferred:
    """The Kafka-source columns ``aggregate`` needs (see the module's steps), or None: all."""
    from pyspark.errors import AnalysisException

    try:
        with quiet_analysis_errors():
            plan = optimized_section(explained_plan(spark, aggregate))
            columns = columns_in_plan(plan or "")
            if columns is None:
                return Inferred(None, "Spark's optimized plan did not show which columns it uses")
            if not columns:  # a count of rows uses no column: read the cheapest (repeated per range)
                columns = ("topic",)
            if columns == KAFKA_SOURCE_COLUMNS:
                return Inferred(None, "the query uses every column")
            narrowed = optimized_section(explained_plan(spark, aggregate, columns))
    except AnalysisException as e:  # the batch will fail on it as before, in its own words
        return Inferred(None, f"the query did not analyse: {first_line(e)}")
    if narrowed is None or _without_ids(narrowed) != _without_ids(plan or ""):
        return Inferred(None, f"the query over {', '.join(columns)} alone is not the same query")
    return Inferred(columns, "the only columns Spark's optimized plan of the query uses")

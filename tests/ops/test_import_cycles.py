"""No import cycles inside txstore: every module can be read (and tested) above the ones it uses.

Every ``import`` counts, at module level or inside a function, and under ``TYPE_CHECKING``
too: a deferred import hides a cycle from the interpreter, not from a reader. The implicit
import of a package's ``__init__`` by its submodules does not count (as in import-linter).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "txstore"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The txstore modules ``path`` imports."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif base in modules:
                    found.add(base)
    found.discard(me)
    return found


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    graph = import_graph()
    assert "txstore.spark.stream.stream_source" in graph["txstore.spark.source_format"]  # module level
    # inside a function and TYPE_CHECKING:
    assert "txstore.spark.source.pushdown" in graph["txstore.spark.ranges.tasks"]


def test_txstore_has_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts of ``pyproject.toml`` over the txstore package under ``root``."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
            "--config",
            str(REPO / "pyproject.toml"),
            "--no-cache",
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_hold_the_core_imports_no_client_and_adapters_no_driver() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "5 kept, 0 broken" in result.stdout


def test_the_contracts_catch_a_client_in_the_core_a_driver_import_and_an_upward_layer(tmp_path: Path) -> None:
    copy = tmp_path / "txstore"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for module, line in (
        ("core/errors.py", "import psycopg  # a client in the pure core\n"),
        ("spark/source/arrow.py", "from txstore.job import JobSettings  # an adapter importing the driver\n"),
        (
            "kafka/mirror.py",
            "from txstore.postgres.db import connect  # a lower layer importing a higher one\n",
        ),
        (
            "spark/ranges/range_task.py",
            "from txstore.spark.stream.stream_sink import stream_writer  # the range tasks importing the stream\n",
        ),
        (
            "postgres/sink.py",
            "from txstore.postgres.results.results_table import ResultsTable  # the sink importing results\n",
        ),
    ):
        path = copy / module
        path.write_text(path.read_text() + "\n\ndef _sneaky() -> None:\n    " + line)
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "0 kept, 5 broken" in result.stdout, result.stdout[-3000:]
    for named in (
        "txstore.core.errors -> psycopg",
        "txstore.spark.source.arrow -> txstore.job",
        "txstore.kafka.mirror -> txstore.postgres.db",
        "txstore.spark.ranges.range_task -> txstore.spark.stream.stream_sink",
        "txstore.postgres.sink -> txstore.postgres.results.results_table",
    ):
        assert named in result.stdout, result.stdout[-3000:]

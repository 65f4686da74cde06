"""The mutants of one module: a curated list of small, plausible bugs, applied by text.

Python (found with :mod:`ast`, applied to the exact characters in the source, so a diff shows
one changed operator):

- comparisons: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``is`` and ``is not``,
  ``in`` and ``not in``, each into the other;
- arithmetic: ``+`` and ``-`` into each other, ``*`` into ``/``, ``/`` and ``//`` into ``*``
  and ``/``; augmented ``+=`` into ``-=`` and ``=``, ``|=`` into ``&=``;
- logic: ``and`` and ``or`` into each other, ``not`` dropped, a condition (``if``, ``while``,
  a conditional expression, a comprehension's filter) negated unless it is one comparison;
- constants: an integer ``n`` into ``n + 1`` and, if positive, ``n - 1``; ``True`` and
  ``False`` into each other;
- names: ``min`` and ``max``, ``any`` and ``all``, ``ceil`` and ``floor`` into each other;
- statements: a call on its own (``conn.commit()``, ``cur.execute(...)``) replaced by
  ``pass``; ``break`` and ``continue`` into each other.

SQL (in string literals that hold a statement; the logical string across implicitly
concatenated literals and f-strings, where ``{...}`` is left alone; :mod:`mutation.sql_operators`):

- each condition of a ``WHERE``, ``ON`` or ``FILTER (WHERE ...)`` dropped (``TRUE`` if alone):
  a guard removed;
- ``=`` in a condition into ``>=`` and ``<=``; ``<``/``<=``/``>``/``>=`` into their
  neighbour: a guard weakened;
- ``IS NULL`` and ``IS NOT NULL`` into each other; ``+`` and ``-`` into each other;
  ``coalesce(a, b)`` into ``a``; ``greatest``/``least`` and ``max``/``min`` into each other.

Left alone: docstrings, type annotations, logging calls (and conditions that only choose
whether to log), and text that is not SQL (error messages). A mutant that does not compile is dropped, and so is one equal to another.
Each mutant has a stable id (the module, the function, the operator, the text of the line
and its occurrence there), so a list of known equivalent mutants survives edits elsewhere.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import io
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from mutation.sql_operators import Edit, Logical, sql_mutants


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repository root, e.g. txstore/postgres/sink.py
    scope: str  # the function, method or constant it is in
    line: int
    operator: str  # what it does, e.g. "< -> <="
    edits: tuple[Edit, ...]
    ident: str = ""

    def apply(self, source: str) -> str:
        out = source
        for start, end, text in sorted(self.edits, reverse=True):
            out = out[:start] + text + out[end:]
        return out


class _Source:
    """Positions: ast's (line, UTF-8 byte column) and tokenize's (line, character column) into
    offsets in the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def byte_pos(self, line: int, col: int) -> int:
        raw = self.lines[line - 1].encode()
        return self.starts[line - 1] + len(raw[:col].decode(errors="replace"))

    def char_pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def node_span(self, node: ast.AST) -> tuple[int, int]:
        end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
        assert end_line is not None and end_col is not None
        return self.byte_pos(node.lineno, node.col_offset), self.byte_pos(end_line, end_col)  # type: ignore[attr-defined]

    def line_of(self, pos: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi - 1:
            mid = (lo + hi) // 2
            if self.starts[mid] <= pos:
                lo = mid
            else:
                hi = mid
        return lo + 1


_CMP = {
    ast.Lt: ["<="],
    ast.LtE: ["<"],
    ast.Gt: [">="],
    ast.GtE: [">"],
    ast.Eq: ["!="],
    ast.NotEq: ["=="],
    ast.Is: ["is not"],
    ast.IsNot: ["is"],
    ast.In: ["not in"],
    ast.NotIn: ["in"],
}
_CMP_TEXT = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
_BIN = {
    ast.Add: ("+", ["-"]),
    ast.Sub: ("-", ["+"]),
    ast.Mult: ("*", ["/"]),
    ast.Div: ("/", ["*"]),
    ast.FloorDiv: ("//", ["/", "*"]),
}
_AUG = {ast.Add: ("+=", ["-=", "="]), ast.Sub: ("-=", ["+=", "="]), ast.BitOr: ("|=", ["&="])}
_NAMES = {"min": "max", "max": "min", "any": "all", "all": "any"}
_ATTRS = {"ceil": "floor", "floor": "ceil"}
_LOGGERS = {"log", "logger", "logging", "LOG"}


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and parent is not None
        and getattr(parent, "body", [None])[0] is node
    )


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner = node.func.value
    return isinstance(owner, ast.Name) and owner.id in _LOGGERS


def _scopes(tree: ast.Module, wanted: Sequence[str]) -> Iterator[tuple[str, ast.AST]]:
    """The nodes named in ``wanted``: ``func``, ``Class``, ``Class.method``, ``CONSTANT``."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted:
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            if node.name in wanted:
                yield node.name, node
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{node.name}.{item.name}"
                    if name in wanted:
                        yield name, item
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in wanted and node.value is not None:
                    yield target.id, node.value


class _Finder:
    def __init__(self, path: str, source: _Source, tokens: list[tokenize.TokenInfo]) -> None:
        self.path = path
        self.src = source
        self.tokens = tokens
        self.starts = [source.char_pos(*t.start) for t in tokens]
        self.found: list[Mutant] = []
        self.scope = ""

    # -- helpers

    def add(self, pos: int, operator: str, edits: Sequence[Edit]) -> None:
        self.found.append(Mutant(self.path, self.scope, self.src.line_of(pos), operator, tuple(edits)))

    def ops_between(self, start: int, end: int) -> list[tokenize.TokenInfo]:
        """The OP and NAME tokens strictly between two offsets, outside parentheses opened there."""
        out = []
        depth = 0
        for tok in self.tokens[bisect.bisect_left(self.starts, start) :]:
            pos = self.src.char_pos(*tok.start)
            if pos >= end:
                break
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif depth == 0 and tok.type in (tokenize.OP, tokenize.NAME):
                out.append(tok)
        return out

    def replace_tokens(self, toks: Sequence[tokenize.TokenInfo], old: str, new: str, pos: int) -> None:
        if not toks:
            return
        start = self.src.char_pos(*toks[0].start)
        end = self.src.char_pos(*toks[-1].end)
        if self.src.text[start:end].split() != old.split():
            return
        self.add(pos, f"{old} -> {new}", [(start, end, new)])

    # -- the walk

    def visit(self, node: ast.AST, parent: ast.AST | None = None) -> None:
        if _is_docstring(node, parent) or _is_log_call(node) or isinstance(node, ast.JoinedStr):
            return
        if isinstance(node, ast.Expr) and _is_log_call(node.value):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                self.visit(statement, node)
            return  # arguments' defaults and annotations are left alone
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.visit(node.value, node)
            return
        self.mutate(node)
        for child in ast.iter_child_nodes(node):
            self.visit(child, node)

    def mutate(self, node: ast.AST) -> None:
        src = self.src
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                start, end = src.node_span(left)[1], src.node_span(right)[0]
                toks = self.ops_between(start, end)
                for new in _CMP.get(type(op), []):
                    self.replace_tokens(toks, _CMP_TEXT[type(op)], new, start)
                left = right
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            old, news = _BIN[type(node.op)]
            start, end = src.node_span(node.left)[1], src.node_span(node.right)[0]
            toks = [t for t in self.ops_between(start, end) if t.string == old]
            for new in news:
                self.replace_tokens(toks[:1], old, new, start)
        elif isinstance(node, ast.BoolOp):
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            for a, b in zip(node.values, node.values[1:], strict=False):
                start, end = src.node_span(a)[1], src.node_span(b)[0]
                toks = [t for t in self.ops_between(start, end) if t.string == old]
                self.replace_tokens(toks[:1], old, new, start)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            start = src.node_span(node)[0]
            inner = src.node_span(node.operand)[0]
            word = "not" if isinstance(node.op, ast.Not) else "-"
            self.add(start, f"drop {word}", [(start, inner, "")])
        elif isinstance(node, ast.AugAssign) and type(node.op) in _AUG:
            old, news = _AUG[type(node.op)]
            start, end = src.node_span(node.target)[1], src.node_span(node.value)[0]
            toks = [t for t in self.ops_between(start, end) if t.string == old]
            for new in news:
                self.replace_tokens(toks[:1], old, new, start)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            start, end = src.node_span(node)
            n = node.value
            self.add(start, f"{n} -> {n + 1}", [(start, end, str(n + 1))])
            if n > 0:
                self.add(start, f"{n} -> {n - 1}", [(start, end, str(n - 1))])
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            start, end = src.node_span(node)
            self.add(start, f"{node.value} -> {not node.value}", [(start, end, str(not node.value))])
        elif isinstance(node, ast.Name) and node.id in _NAMES and isinstance(node.ctx, ast.Load):
            start, end = src.node_span(node)
            self.add(start, f"{node.id} -> {_NAMES[node.id]}", [(start, end, _NAMES[node.id])])
        elif isinstance(node, ast.Attribute) and node.attr in _ATTRS:
            end = src.node_span(node)[1]
            start = end - len(node.attr)
            self.add(start, f".{node.attr} -> .{_ATTRS[node.attr]}", [(start, end, _ATTRS[node.attr])])
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            start, end = src.node_span(node)
            self.add(start, "call -> pass", [(start, end, "pass")])
        elif isinstance(node, (ast.Break, ast.Continue)):
            start, end = src.node_span(node)
            old, new = ("break", "continue") if isinstance(node, ast.Break) else ("continue", "break")
            self.add(start, f"{old} -> {new}", [(start, end, new)])
        tests: list[ast.expr] = []
        only_logs = (
            isinstance(node, ast.If)
            and not node.orelse
            and all(isinstance(st, ast.Expr) and _is_log_call(st.value) for st in node.body)
        )
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and not only_logs:
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests += node.ifs
        for test in tests:
            if isinstance(test, ast.Compare) and len(test.ops) == 1:
                continue  # its operator is mutated instead
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                continue  # dropping the not is the negation
            start, end = src.node_span(test)
            self.add(start, "negate condition", [(start, start, "not ("), (end, end, ")")])


def _string_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """String literals under ``root``, except docstrings, the parts of an f-string, and the
    arguments of logging calls."""
    skip: set[int] = set()
    for node in ast.walk(root):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0], node):
            skip.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        if _is_log_call(node):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(root):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str)
        ):
            yield node


def find_mutants(path: str, text: str, scopes: Sequence[str]) -> list[Mutant]:
    """Every mutant of the named scopes of one module, with its id; compiled to be sure."""
    source = _Source(text)
    tree = ast.parse(text)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    finder = _Finder(path, source, tokens)
    seen_strings: set[int] = set()
    for name, node in _scopes(tree, scopes):
        finder.scope = name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            finder.visit(node)
        else:
            finder.visit(node, None)
        for string in _string_nodes(node):
            start, end = source.node_span(string)
            if start in seen_strings:
                continue
            seen_strings.add(start)
            logical = Logical()
            ok = True
            for tok in tokens:
                pos = source.char_pos(*tok.start)
                if pos < start:
                    continue
                if pos >= end:
                    break
                if tok.type == tokenize.STRING:
                    ok = logical.add_token(tok.string, pos) and ok
                elif tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                    logical.add_text(tok.string, pos, False)
            if ok and logical.chars:
                sql_mutants(logical, finder.add)
    return _valid(path, text, finder.found)


def _valid(path: str, text: str, found: list[Mutant]) -> list[Mutant]:
    out: list[Mutant] = []
    sources: set[str] = {text}
    occurrences: dict[tuple[str, str, str], int] = {}
    lines = text.splitlines()
    for m in found:
        mutated = m.apply(text)
        if mutated in sources:
            continue
        try:
            compile(mutated, path, "exec")
        except SyntaxError:
            continue
        sources.add(mutated)
        line_text = lines[m.line - 1].strip()
        key = (m.scope, m.operator, line_text)
        occurrences[key] = occurrences.get(key, 0) + 1
        # The module's file name, not its path: a module moved to another package keeps its ids.
        digest = hashlib.sha1(
            f"{PurePosixPath(path).stem}|{m.scope}|{m.operator}|{line_text}|{occurrences[key]}".encode()
        ).hexdigest()
        out.append(Mutant(m.path, m.scope, m.line, m.operator, m.edits, digest[:8]))
    return out

"""The SQL mutants of :mod:`mutation.operators`: in a string literal that holds a statement (the
logical string across implicitly concatenated literals and f-strings, :class:`Logical`), each
condition of a ``WHERE``/``ON`` dropped, comparisons weakened, ``IS NULL`` flipped, ``+``/``-``
swapped, ``coalesce`` cut to its first argument, ``greatest``/``least`` swapped
(:func:`sql_mutants`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

Edit = tuple[int, int, str]
"""[start, end) in the source text, replaced by the text."""


_SQL = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE)\b")
_CLAUSE_START = re.compile(r"\b(WHERE|ON)\b(?!\s+CONFLICT)", re.I)
_CLAUSE_END = re.compile(
    r"\b(ORDER|GROUP|RETURNING|LIMIT|FOR|UNION|HAVING|WINDOW|DO|JOIN|LEFT|RIGHT|INNER|SELECT|FROM|WHERE"
    r"|INSERT|UPDATE|SET|ON|WITH)\b|;",
    re.I,
)
_AND = re.compile(r"\bAND\b", re.I)
_EQ = re.compile(r"(?<![<>!:=])=(?![=>])")
_ORDERING = {"<=": "<", ">=": ">", "<": "<=", ">": ">="}
_ORDER_OP = re.compile(r"<=|>=|(?<![<-])<(?![=>])|(?<![-=>])>(?!=)")
_NULLS = [
    (re.compile(r"\bIS\s+NOT\s+NULL\b", re.I), "IS NULL"),
    (re.compile(r"\bIS\s+NULL\b", re.I), "IS NOT NULL"),
]
_ARITH = re.compile(r"(?<=\s)[+-](?=\s)")
_FUNCS = {"greatest": "least", "least": "greatest", "max": "min", "min": "max"}
_FUNC = re.compile(r"\b(greatest|least|max|min)\s*\(", re.I)
_COALESCE = re.compile(r"\bcoalesce\s*\(", re.I)


class Logical:
    """The runtime text of a string literal (or several, implicitly concatenated), with each
    character's offset in the source. Characters inside an f-string's ``{...}`` read as ``_``."""

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.where: list[int] = []

    @property
    def text(self) -> str:
        return "".join(self.chars)

    def add_token(self, token: str, start: int) -> bool:
        match = re.match(r"(?i)([rbuf]*)('''|\"\"\"|'|\")", token)
        if not match:
            return False
        prefix, quote = match.group(1).lower(), match.group(2)
        inner_start = match.end()
        inner = token[inner_start : len(token) - len(quote)]
        if "\\" in inner and "r" not in prefix:
            return False
        self.add_text(inner, start + inner_start, "f" in prefix)
        return True

    def add_text(self, inner: str, start: int, fstring: bool) -> None:
        depth = 0
        for i, ch in enumerate(inner):
            if fstring and ch == "{":
                depth += 1
            visible = "_" if depth else ch
            if fstring and ch == "}":
                depth = max(depth - 1, 0)
            self.chars.append(visible)
            self.where.append(start + i)

    def runs(self, a: int, b: int) -> list[tuple[int, int]]:
        """Source spans of logical characters [a, b), merged where contiguous."""
        out: list[tuple[int, int]] = []
        for i in range(a, b):
            pos = self.where[i]
            if out and out[-1][1] == pos:
                out[-1] = (out[-1][0], pos + 1)
            else:
                out.append((pos, pos + 1))
        return out

    def edit(self, a: int, b: int, text: str) -> list[Edit]:
        runs = self.runs(a, b)
        if not runs:
            pos = self.where[a] if a < len(self.where) else self.where[-1] + 1
            return [(pos, pos, text)]
        return [(runs[0][0], runs[0][1], text)] + [(s, e, "") for s, e in runs[1:]]


def _outside_quotes(text: str) -> list[bool]:
    inside = False
    flags = []
    for ch in text:
        if ch == "'":
            inside = not inside
            flags.append(False)
        else:
            flags.append(not inside)
    return flags


def _conditions(text: str) -> Iterator[list[tuple[int, int]]]:
    """Each WHERE/ON clause's conditions, as [start, end) spans of the text."""
    free = _outside_quotes(text)
    for clause in _CLAUSE_START.finditer(text):
        if not free[clause.start()]:
            continue
        pos = clause.end()
        depth = 0
        parts: list[tuple[int, int]] = []
        start = pos
        i = pos
        while i < len(text):
            ch = text[i]
            if not free[i]:
                i += 1
                continue
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth < 0:
                    break
            elif depth == 0:
                if _AND.match(text, i) and (i == 0 or not text[i - 1].isalnum()):
                    parts.append((start, i))
                    i += 3
                    start = i
                    continue
                end = _CLAUSE_END.match(text, i)
                distinct = re.search(r"\bDISTINCT\s+$", text[max(pos, i - 12) : i], re.I)
                if end and i > pos and not (text[i - 1].isalnum() or text[i - 1] == "_") and not distinct:
                    break
            i += 1
        parts.append((start, i))
        spans = []
        for a, b in parts:
            piece = text[a:b]
            lead = len(piece) - len(piece.lstrip())
            trail = len(piece) - len(piece.rstrip())
            if piece.strip():
                spans.append((a + lead, b - trail))
        if spans:
            yield spans


def sql_mutants(logical: Logical, found: Callable[[int, str, Sequence[Edit]], None]) -> None:
    """Each SQL mutant of one logical string, given to ``found`` as (its first edit's offset,
    what it does, its edits)."""
    text = logical.text
    if not _SQL.search(text):
        return
    free = _outside_quotes(text)

    def add(a: int, b: int, new: str, operator: str) -> None:
        edits = logical.edit(a, b, new)
        found(edits[0][0], f"sql: {operator}", edits)

    for spans in _conditions(text):
        for k, (a, b) in enumerate(spans):
            cond = " ".join(text[a:b].split())
            if len(spans) == 1:
                add(a, b, "TRUE", f"drop condition {cond}")
            elif k + 1 < len(spans):
                add(a, spans[k + 1][0], "", f"drop condition {cond}")
            else:
                add(spans[k - 1][1], b, "", f"drop condition {cond}")
            for m in _EQ.finditer(text, a, b):
                if free[m.start()]:
                    for new in (">=", "<="):
                        add(m.start(), m.end(), new, f"{cond}: = -> {new}")
            for m in _ORDER_OP.finditer(text, a, b):
                if free[m.start()]:
                    new = _ORDERING[m.group()]
                    add(m.start(), m.end(), new, f"{cond}: {m.group()} -> {new}")
    for pattern, new in _NULLS:
        for m in pattern.finditer(text):
            if free[m.start()]:
                add(m.start(), m.end(), new, f"{' '.join(m.group().split())} -> {new}")
    for m in _ARITH.finditer(text):
        if free[m.start()]:
            new = "-" if m.group() == "+" else "+"
            context = " ".join(text[max(0, m.start() - 20) : m.end() + 20].split())
            add(m.start(), m.end(), new, f"{m.group()} -> {new} in '{context}'")
    for m in _FUNC.finditer(text):
        if free[m.start()]:
            name = m.group(1)
            new = _FUNCS[name.lower()]
            add(m.start(1), m.end(1), new, f"{name}( -> {new}(")
    for m in _COALESCE.finditer(text):
        if not free[m.start()]:
            continue
        depth, i, comma = 1, m.end(), None
        while i < len(text) and depth:
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
            elif text[i] == "," and depth == 1 and comma is None:
                comma = i
            i += 1
        if comma is None or depth:
            continue
        first = text[m.end() : comma].strip()
        add(m.start(), i, first, f"coalesce({first}, ...) -> {first}")

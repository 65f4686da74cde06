"""mutation/EQUIVALENT.md names the surviving mutants of ``./dev mutate`` by id; an id is a hash
of the mutated line's text, its scope and its module's file name. A line edited (or a module
renamed) makes new ids and leaves the listed ones naming nothing: ``./dev mutate`` then fails on
survivors the file seems to explain. It runs by hand, not in CI, so this checks in CI, in
seconds and without running a mutant, that every listed id is a mutant of today's code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mutation.mutate import EQUIVALENT, MODULES
from mutation.operators import find_mutants

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_mutant_equivalent_md_explains_is_a_mutant_of_the_code_today() -> None:
    today = {
        m.ident
        for module in MODULES
        for m in find_mutants(module.path, (REPO / module.path).read_text(), module.scopes)
    }
    listed = set(re.findall(r"`([0-9a-f]{8})`", EQUIVALENT.read_text()))
    assert listed, "no ids found in mutation/EQUIVALENT.md"
    stale = sorted(listed - today)
    assert not stale, (
        f"mutation/EQUIVALENT.md lists {len(stale)} ids no mutant has today ({', '.join(stale)}): "
        "a listed line was edited or its module renamed; run ./dev mutate --module NAME and update the file"
    )


def test_a_mutant_id_survives_a_move_to_another_package_but_not_an_edit_of_its_line() -> None:
    source = "def f(a: int) -> bool:\n    return a < 10\n"
    here = {m.ident for m in find_mutants("txstore/sink.py", source, ("f",))}
    moved = {m.ident for m in find_mutants("txstore/postgres/sink.py", source, ("f",))}
    edited = {m.ident for m in find_mutants("txstore/sink.py", source.replace("10", "11"), ("f",))}
    assert here and here == moved
    assert not here & edited

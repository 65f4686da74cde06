"""mutation/EQUIVALENT.md names the surviving mutants of ``./dev mutate`` by id; an id is a hash
of the mutated line's text, its scope and its module's file name. A line edited (or a module
renamed) makes new ids and leaves the listed ones naming nothing: ``./dev mutate`` then fails on
survivors the file seems to explain. It runs by hand, not in CI, so this checks in CI, in
seconds and without running a mutant, that every listed id is a mutant of today's code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mutation.modules import EQUIVALENT, MODULES
from mutation.mutate import equivalent_ids
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


@pytest.mark.slow
def test_the_mutation_table_and_the_readme_count_the_survivors_equivalent_md_lists() -> None:
    """docs/chaos.md's table says per module how many survivors are listed, and the README sums
    the table: both must agree with the file, so a run's new survivors cannot leave them stale."""
    chaos = (REPO / "docs" / "chaos.md").read_text().splitlines()
    start = max(n for n, line in enumerate(chaos) if line.startswith("| module | mutants"))
    rows: dict[str, tuple[int, int, int]] = {}
    for line in chaos[start + 2 :]:
        if not line.startswith("|"):
            break
        name, mutants, killed, equivalent = (cell.strip() for cell in line.strip("| \n").split("|"))
        rows[name.split()[0]] = (int(mutants), int(killed), int(equivalent))
    listed = set(equivalent_ids())
    assert {m.name for m in MODULES} == set(rows), (
        "docs/chaos.md's table has a row per module of ./dev mutate"
    )
    for module in MODULES:
        mutants, killed, equivalent = rows[module.name]
        assert killed + equivalent == mutants, (
            f"docs/chaos.md, {module.name}: killed and listed do not add up"
        )
        ids = {m.ident for m in find_mutants(module.path, (REPO / module.path).read_text(), module.scopes)}
        assert equivalent == len(ids & listed), (
            f"docs/chaos.md says {equivalent} survivors of {module.name} are listed, "
            f"mutation/EQUIVALENT.md lists {len(ids & listed)}"
        )
    total = sum(r[0] for r in rows.values())
    killed = sum(r[1] for r in rows.values())
    survivors = total - killed
    assert f"Each survivor ({survivors} in the table above)" in "\n".join(chaos)
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        f"finds {killed} of {total} small bugs in the guarantee code "
        f"({100 * killed / total:.1f}%; each of the other {survivors} is listed" in readme
    )

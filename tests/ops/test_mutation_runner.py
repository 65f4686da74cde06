"""The mutation runner cleans up after a mutant whose tests it killed at their timeout.

A killed test run leaves its databases behind, and the runner drops them. It used to drop
every database LIKE ``txstore_%_PID%``, PID the killed child's: with pids wrapping round on a
busy machine, a child with pid 1187 took ``txstore_mutate_11878_w0``, the runner's own worker
database, and every later mutant of the database-backed modules then "failed" on a database
that did not exist: all 282 of three modules counted killed by that, not by a test, 19 listed as
surviving among them (a full run on 2026-11-25; the same modules alone: 263 killed, 19
equivalent). Now each test run gets a run id
of its own (``TXSTORE_TEST_RUN``, its databases' suffix), and only those are dropped.
"""

from __future__ import annotations

import psycopg

from mutation.mutate import mutant_run_id, run_databases


def _matches(db: psycopg.Connection, name: str, patterns: list[str]) -> bool:
    return any(db.execute("SELECT %s LIKE %s", (name, p)).fetchone() == (True,) for p in patterns)


def test_a_killed_test_runs_cleanup_takes_its_own_databases_and_nothing_else(db: psycopg.Connection) -> None:
    run = mutant_run_id(1187)
    patterns = run_databases(run)
    for own in (
        f"txstore_test_{run}",
        f"txstore_test_{run}_tmpl",
        f"txstore_empty_{run}",
        f"txstore_test_{run}_db",
    ):
        assert _matches(db, own, patterns), own
    others = [
        "txstore_mutate_11878_w0",  # the runner's own worker database (pid 11878)
        "txstore_mutate_11878",
        f"txstore_test_{mutant_run_id(1187)}",  # another run of the same job number
        "txstore_test_1187",  # a test run of pid 1187 in another pid namespace
        "txstore_bench_1187_4f2a",
    ]
    for other in others:
        assert not _matches(db, other, patterns), other


def test_every_test_run_has_an_id_of_its_own() -> None:
    ids = {mutant_run_id(job) for job in (1, 1, 2, 11, 11)}
    assert len(ids) == 5


def _ranges_run(listed_outcome: int) -> tuple[int, str]:
    """A run of the ranges module's mutants in which every mutant is killed (pytest exit 1) but
    those EQUIVALENT.md lists, which end with ``listed_outcome``; the report's exit code and text."""
    import argparse
    import contextlib
    import io

    from mutation.modules import MODULES, REPO
    from mutation.mutate import Result, equivalent_ids, report
    from mutation.operators import find_mutants

    module = next(m for m in MODULES if m.name == "ranges")
    source = (REPO / module.path).read_text()
    mutants = find_mutants(module.path, source, module.scopes)
    listed = equivalent_ids()
    results = [
        Result(module, m, listed_outcome if m.ident in listed else 1, 0.1, "E   psycopg...") for m in mutants
    ]
    args = argparse.Namespace(report=None, module=["ranges"], only=[], target=0.9)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = report([module], {module.name: mutants}, {module.name: source}, results, 1.0, args)
    return code, out.getvalue()


def test_a_run_that_kills_a_mutant_listed_as_surviving_fails_and_names_it() -> None:
    """What a run whose environment failed looks like: every mutant "killed", those listed as
    surviving too; the run says so and fails instead of reporting a perfect score."""
    code, text = _ranges_run(listed_outcome=1)
    assert code == 1
    assert "mutants mutation/EQUIVALENT.md lists as surviving were killed" in text
    assert "43683fca" in text and "fd4c424d" in text
    code, text = _ranges_run(listed_outcome=0)
    assert code == 0, text
    assert "were killed" not in text

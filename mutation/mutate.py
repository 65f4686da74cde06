"""``./dev mutate``: mutation testing of the code that carries exactly-once.

For each guarantee module (:data:`~mutation.modules.MODULES`: the sink and conflict classification, planning
and range splitting, the reader's range bounds, fingerprints and topic IDs, exact
arithmetic, the idempotent sink, the outbox, the offset store, bad messages, and the stream's
verification, plans, options, source and sink), every mutant of its curated scope
(:mod:`mutation.operators`) is run against the module's fast test selection: no Spark, no
broker process; PostgreSQL where the guard is SQL (the stream's source and sink are called as
Spark calls them, tests/spark/stream/test_stream_guards.py). A mutant is
*killed* when a test fails (or the run times out), and *survives* when every test passes.

It runs in private copies of the repository (one per worker, under a temporary directory),
never in the checkout, so others can keep running tests there; each copy's worker imports
txstore from that copy (checked before anything runs). The copies hold the working tree's
files (tracked and untracked, not ignored) or, with ``--head``, the last commit.

Prints killed/survived per module and each survivor with its diff. Survivors listed in
``mutation/EQUIVALENT.md`` by id, with why they cannot change behaviour, are counted apart.
Exits 1 if a survivor is not listed there, or fewer than ``--target`` of the mutants that
are not equivalent were killed; 2 if a module's tests fail without any mutation.

Usage: ``./dev mutate [--module sink ...] [--jobs 2] [--head] [--list] [--keep]``
(PGHOST/PGPORT name the PostgreSQL server, as for the tests).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutation.modules import EQUIVALENT, MODULES, REPO, Module
from mutation.operators import Mutant, find_mutants

PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--no-header", "-o", "addopts="]


@dataclass
class Result:
    module: Module
    mutant: Mutant | None  # None: the unmutated run
    code: int | None = None  # pytest's exit code; None: timed out
    seconds: float = 0.0
    tail: str = ""

    @property
    def outcome(self) -> str:
        if self.code is None:
            return "timeout"  # counted as killed
        if self.code == 0:
            return "survived"
        if self.code in (1, 2):  # tests failed, or the mutated module failed to import
            return "killed"
        return "error"


@dataclass
class Worker:
    index: int
    copy: Path
    process: subprocess.Popen[str]
    logs: Path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, job_id: int, module: Module, source: str | None, timeout: float) -> dict[str, Any]:
        job = {
            "id": job_id,
            "path": module.path,
            "source": source,
            "args": [*PYTEST_ARGS, *(["-k", module.keyword] if module.keyword else []), *module.tests],
            "timeout": timeout,
            "log": str(self.logs / f"{job_id}.log"),
            "run": mutant_run_id(job_id),
        }
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"mutation worker {self.index} stopped")
        answer: dict[str, Any] = json.loads(line)
        return answer


def copy_tree(files: Sequence[str], source: Path, target: Path) -> None:
    for name in files:
        src = source / name
        if src.is_file():
            dst = target / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def checkout_files(head: bool, scratch: Path) -> tuple[Path, list[str]]:
    """The files to copy: the working tree's (tracked and untracked, not ignored), or HEAD's."""
    if head:
        exported = scratch / "head"
        exported.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(exported)], input=archive, check=True)
        files = [str(p.relative_to(exported)) for p in exported.rglob("*") if p.is_file()]
        return exported, files
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.decode()
    return REPO, [f for f in listed.split("\0") if f]


def pg_connect() -> Any:
    import psycopg

    return psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=os.environ.get("PGPORT", "5432"),
        user=os.environ.get("PGUSER", "postgres"),
        password=os.environ.get("PGPASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    )


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 1).close()
    except OSError:
        return False
    return True


def pg_url(name: str) -> str:
    user = os.environ.get("PGUSER", "postgres")
    password = os.environ.get("PGPASSWORD")
    auth = f"{user}:{password}" if password else user
    return f"postgresql://{auth}@{os.environ['PGHOST']}:{os.environ.get('PGPORT', '5432')}/{name}"


def make_databases(copy: Path, template: str, workers: int) -> list[str | None]:
    """One migrated template (the copy's migrations), and a database copied from it for each
    worker's fast tests (tests/helpers/fast_db.py). None each without PGHOST: the tests then find or
    start their own server and make their own databases."""
    if not os.environ.get("PGHOST"):
        return [None] * workers
    with pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{template}"')
        conn.execute(f'CREATE DATABASE "{template}"')
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from txstore.postgres.migrate import upgrade; upgrade(sys.argv[1])",
            pg_url(template),
        ],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        check=True,
    )
    names: list[str | None] = []
    with pg_connect() as conn:
        conn.execute(f'ALTER DATABASE "{template}" WITH is_template true')
        for i in range(workers):
            name = f"{template}_w{i}"
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            names.append(name)
    return names


def mutant_run_id(job_id: int) -> str:
    """A mutant's test run's id: its databases' suffix (``TXSTORE_TEST_RUN``, tests/conftest.py).
    The job number and a random part: a pid is no name of its own here (pids wrap round, and
    test runs in other pid namespaces may share the server)."""
    return f"m{job_id}x{secrets.token_hex(4)}"


def run_databases(run: str) -> list[str]:
    """LIKE patterns of the databases a test run of id ``run`` makes: ``txstore_<kind>_<run>``,
    and those named after it (``_tmpl``, a module's shared database)."""
    return [f"txstore\\_%\\_{run}", f"txstore\\_%\\_{run}\\_%"]


def drop_databases(names_like: Sequence[str]) -> None:
    """Drop the databases whose names are LIKE these (the run's own, and what a run killed at
    its timeout left behind)."""
    if not os.environ.get("PGHOST"):
        return
    with pg_connect() as conn:
        for pattern in names_like:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (pattern,)
            ).fetchall()
            for (name,) in rows:
                conn.execute(f'ALTER DATABASE "{name}" WITH is_template false')
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_worker(index: int, copy: Path, logs: Path, template: str | None, database: str | None) -> Worker:
    env = {**os.environ, "PYTHONPATH": str(copy), "TXSTORE_MUTATE_REPO": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TXSTORE_MUTATE_DATABASE", None)
    if template and database:
        env["TXSTORE_MUTATE_TEMPLATE"] = template
        env["TXSTORE_MUTATE_DATABASE"] = pg_url(database)
    process = subprocess.Popen(
        [sys.executable, "-m", "mutation.worker"],
        cwd=copy,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    ready = json.loads(process.stdout.readline())
    where = Path(ready["txstore"])
    if copy.resolve() not in where.parents:
        process.kill()
        raise SystemExit(f"mutate: worker {index} imports txstore from {where}, not from its copy {copy}")
    return Worker(index, copy, process, logs)


def equivalent_ids() -> dict[str, str]:
    """Ids listed in EQUIVALENT.md (backquoted 8-hex-digit ids in a list item), with their line."""
    if not EQUIVALENT.exists():
        return {}
    found = {}
    for line in EQUIVALENT.read_text().splitlines():
        if re.match(r"\s*[-*]\s+`[0-9a-f]{8}`", line):
            for ident in re.findall(r"`([0-9a-f]{8})`", line):
                found[ident] = line.strip()
    return found


def diff(module: Module, source: str, mutant: Mutant) -> str:
    lines = difflib.unified_diff(
        source.splitlines(keepends=True),
        mutant.apply(source).splitlines(keepends=True),
        fromfile=f"a/{module.path}",
        tofile=f"b/{module.path}",
        n=1,
    )
    return "".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=[m.name for m in MODULES], help="only these")
    parser.add_argument("--jobs", type=int, default=2, help="workers, each in its own copy (default 2)")
    parser.add_argument("--head", action="store_true", help="mutate the last commit, not the working tree")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--only", action="append", default=[], help="only the mutants with these ids")
    parser.add_argument("--target", type=float, default=0.9, help="killed share required (default 0.9)")
    parser.add_argument("--keep", action="store_true", help="keep the copies and logs")
    parser.add_argument("--report", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    if not os.environ.get("PGHOST") and _answers("127.0.0.1", 5432):
        os.environ.update(PGHOST="127.0.0.1", PGPORT="5432")  # as the tests would find it
    modules = [m for m in MODULES if not args.module or m.name in args.module]
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="txstore-mutate-"))
    source_root, files = checkout_files(args.head, scratch)
    sources = {m.name: (source_root / m.path).read_text() for m in modules}
    mutants = {m.name: find_mutants(m.path, sources[m.name], m.scopes) for m in modules}
    if args.only:
        mutants = {k: [x for x in v if x.ident in args.only] for k, v in mutants.items()}
    total = sum(len(v) for v in mutants.values())
    if args.list:
        for m in modules:
            for x in mutants[m.name]:
                print(f"{x.ident} {m.path}:{x.line} {x.scope}: {x.operator}")
        print(f"{total} mutants")
        shutil.rmtree(scratch, ignore_errors=True)
        return 0

    template = f"txstore_mutate_{os.getpid()}"
    workers: list[Worker] = []
    results: list[Result] = []
    try:
        copies = []
        for i in range(max(1, args.jobs)):
            copy = scratch / f"w{i}"
            copy_tree(files, source_root, copy)
            copies.append(copy)
        databases = make_databases(copies[0], template, len(copies))
        for i, (copy, database) in enumerate(zip(copies, databases, strict=True)):
            logs = scratch / f"logs{i}"
            logs.mkdir()
            workers.append(start_worker(i, copy, logs, template if database else None, database))
        print(
            f"mutate: {total} mutants in {len(modules)} modules, {len(workers)} workers, copies in {scratch}",
            flush=True,
        )
        job_ids = iter(range(1, 10**9))
        lock = threading.Lock()

        def serve(
            worker: Worker, jobs: queue.Queue[tuple[Module, Mutant | None]], timeouts: dict[str, float]
        ) -> None:
            while True:
                try:
                    module, mutant = jobs.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    job_id = next(job_ids)
                source = mutant.apply(sources[module.name]) if mutant else None
                timeout = timeouts.get(module.name, module.timeout)
                answer = worker.run(job_id, module, source, timeout)
                result = Result(module, mutant, answer["code"], answer["seconds"], answer["tail"])
                if result.code is None:
                    drop_databases(run_databases(answer["run"]))
                with lock:
                    results.append(result)
                    if mutant is None:
                        continue
                    done = sum(r.mutant is not None for r in results)
                    if result.outcome in ("survived", "error"):
                        print(
                            f"  {result.outcome}: {mutant.ident} {module.path}:{mutant.line} "
                            f"{mutant.scope}: {mutant.operator}",
                            flush=True,
                        )
                    if done % 50 == 0:
                        print(f"mutate: {done}/{total} ({time.monotonic() - started:.0f}s)", flush=True)

        def run_all(items: list[tuple[Module, Mutant | None]], timeouts: dict[str, float]) -> None:
            jobs: queue.Queue[tuple[Module, Mutant | None]] = queue.Queue()
            for item in items:
                jobs.put(item)
            threads = [threading.Thread(target=serve, args=(w, jobs, timeouts), daemon=True) for w in workers]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.5)

        # The unmutated run of each module: it must pass, and its time sets the mutants' timeout.
        run_all([(m, None) for m in modules], {})
        timeouts: dict[str, float] = {}
        broken = []
        for r in results:
            timeouts[r.module.name] = min(r.module.timeout, 2 * r.seconds + 10)
            if r.outcome != "survived":
                broken.append(r.module.name)
                print(f"mutate: {r.module.name}: the tests fail without any mutation:\n{r.tail}", flush=True)
            else:
                print(f"mutate: {r.module.name}: tests pass unmutated in {r.seconds:.1f}s", flush=True)
        if broken:
            return 2
        results.clear()
        run_all([(m, x) for m in modules for x in mutants[m.name]], timeouts)
    except KeyboardInterrupt:
        print("mutate: interrupted", flush=True)
        for w in workers:
            w.process.terminate()
        return 130
    finally:
        for w in workers:
            if w.process.stdin:
                w.process.stdin.close()
            try:
                w.process.wait(30)
            except subprocess.TimeoutExpired:
                w.process.kill()
        drop_databases([template, f"{template}\\_w%"])
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return report(modules, mutants, sources, results, time.monotonic() - started, args)


def report(
    modules: Sequence[Module],
    mutants: dict[str, list[Mutant]],
    sources: dict[str, str],
    results: list[Result],
    seconds: float,
    args: argparse.Namespace,
) -> int:
    known = equivalent_ids()
    print()
    print(
        f"{'module':<12} {'mutants':>7} {'killed':>7} {'timeout':>7} {'equiv.':>7} {'survived':>8} {'score':>7}"
    )
    unexplained: list[Result] = []
    all_total = all_killed = all_equivalent = 0
    rows = []
    for module in modules:
        mine = [r for r in results if r.module.name == module.name]
        killed = sum(r.outcome in ("killed", "timeout") for r in mine)
        timeouts = sum(r.outcome == "timeout" for r in mine)
        survivors = [r for r in mine if r.outcome in ("survived", "error")]
        equivalent = [r for r in survivors if r.mutant and r.mutant.ident in known]
        unexplained += [r for r in survivors if r not in equivalent]
        total = len(mine)
        score = killed / (total - len(equivalent)) if total - len(equivalent) else 1.0
        all_total += total
        all_killed += killed
        all_equivalent += len(equivalent)
        rows.append(
            {"module": module.name, "mutants": total, "killed": killed, "equivalent": len(equivalent)}
        )
        print(
            f"{module.name:<12} {total:>7} {killed:>7} {timeouts:>7} {len(equivalent):>7} "
            f"{len(survivors) - len(equivalent):>8} {score:>7.1%}"
        )
    overall = all_killed / (all_total - all_equivalent) if all_total - all_equivalent else 1.0
    print(
        f"{'all':<12} {all_total:>7} {all_killed:>7} {'':>7} {all_equivalent:>7} "
        f"{len(unexplained):>8} {overall:>7.1%}   (killed / (mutants - equivalent); raw "
        f"{all_killed}/{all_total} = {all_killed / max(all_total, 1):.1%}) in {seconds / 60:.1f} min"
    )
    if unexplained:
        print(f"\n{len(unexplained)} survivors not explained in {EQUIVALENT.relative_to(REPO)}:")
        for r in sorted(unexplained, key=lambda r: (r.module.path, r.mutant.line if r.mutant else 0)):
            assert r.mutant is not None
            print(
                f"\n--- {r.mutant.ident} ({r.outcome}) {r.module.path}:{r.mutant.line} {r.mutant.scope}: {r.mutant.operator}"
            )
            print(diff(r.module, sources[r.module.name], r.mutant), end="")
            if r.outcome == "error":
                print(r.tail[-1500:])
    # A mutant listed as equivalent that a test killed: the listing is out of date, or the kill
    # is the run's own failure (a database gone, a server down), which would also have counted
    # every other mutant of the module killed. Either way the numbers are not to be trusted yet.
    contradicted = [r for r in results if r.mutant and r.mutant.ident in known and r.outcome == "killed"]
    if contradicted:
        print(
            f"\n{len(contradicted)} mutants {EQUIVALENT.relative_to(REPO)} lists as surviving were "
            "killed: a test now catches them (take them off the list), or the run failed around "
            "them (the log's end below):"
        )
        for r in contradicted:
            assert r.mutant is not None
            print(f"  {r.mutant.ident} {r.module.path}:{r.mutant.line} {r.mutant.scope}: {r.mutant.operator}")
        print(contradicted[0].tail[-1500:])
    present = {x.ident for v in mutants.values() for x in v}
    stale = sorted(set(known) - present)
    if stale and not args.module and not args.only:
        print(f"\n{EQUIVALENT.relative_to(REPO)} lists ids no longer generated: {', '.join(stale)}")
    if args.report:
        args.report.write_text(
            json.dumps(
                {
                    "seconds": seconds,
                    "modules": rows,
                    "survivors": [
                        {
                            "id": r.mutant.ident,
                            "path": r.module.path,
                            "line": r.mutant.line,
                            "operator": r.mutant.operator,
                        }
                        for r in unexplained
                        if r.mutant
                    ],
                },
                indent=2,
            )
        )
    return 1 if unexplained or contradicted or overall < args.target else 0


if __name__ == "__main__":
    sys.exit(main())

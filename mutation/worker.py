"""One mutation worker: a fork server in a private copy of the repository.

Started by :mod:`mutation.mutate` as ``python -m mutation.worker`` with the copy as its
working directory and ``PYTHONPATH``. It imports the heavy third-party libraries once
(pytest, psycopg, confluent-kafka, alembic, pyarrow, pyspark, ...) but never txstore or the tests,
then for each job read from stdin (one JSON line: the module's path, its mutated source or
null for the original, pytest's arguments, a timeout):

1. writes the mutated source over the copy's module (and drops its cached bytecode);
2. forks a child in a process group of its own, which imports txstore from the copy (so the
   mutated module is the one imported) and runs ``pytest.main``, output to a log file;
3. waits up to the timeout (then kills the child's process group), puts the original
   source back, and answers one JSON line: pytest's exit code (None after a timeout), the
   seconds taken and the end of the log.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HEAVY = [
    "pytest",
    "_pytest.python",
    "_pytest.fixtures",
    "psycopg",
    "psycopg.sql",
    "confluent_kafka",
    "confluent_kafka.admin",
    "pytest_postgresql",
    "pytest_postgresql.factories",
    "pytest_postgresql.janitor",
    "pytest_timeout",
    "sqlalchemy",
    "alembic",
    "alembic.command",
    "alembic.config",
    "alembic.runtime.environment",
    "numpy",
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "prometheus_client",
    # The stream modules' tests import PySpark's data source API (no JVM is started): about a
    # second a run on a busy machine.
    "pyspark",
    "pyspark.sql",
    "pyspark.sql.types",
    "pyspark.sql.datasource",
    "pyspark.sql.pandas.types",
]


def _preimport() -> None:
    for name in HEAVY:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _where_txstore_is_imported(copy: Path) -> str:
    """Fork a child that imports txstore and says from where (the copy, not the checkout)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            import txstore

            os.write(write, str(Path(txstore.__file__).resolve()).encode())
        finally:
            os._exit(0)
    os.close(write)
    found = b""
    while chunk := os.read(read, 4096):
        found += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return found.decode()


def _run_child(copy: Path, args: list[str], log: Path, run: str) -> None:
    """In the forked child: run pytest in the copy, output to ``log``, its databases named by
    ``run`` (``TXSTORE_TEST_RUN``); never returns."""
    code = 99
    try:
        os.setpgid(0, 0)
        os.environ["TXSTORE_TEST_RUN"] = run
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(copy)
        import pytest

        from mutation import pytest_plugin

        code = int(pytest.main(args, plugins=[pytest_plugin]))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _drop_bytecode(module: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(importlib.util.cache_from_source(str(module)))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_running: list[int] = []  # the child running now, if any


def _stop(signum: int, frame: Any) -> None:
    """SIGTERM (the runner interrupted): end the running child's process group, then exit."""
    for pid in _running:
        _kill_group(pid)
    os._exit(1)


def run_job(copy: Path, job: dict[str, Any]) -> dict[str, Any]:
    module = copy / job["path"]
    original = module.read_text()
    log = Path(job["log"])
    started = time.monotonic()
    if job["source"] is not None:
        module.write_text(job["source"])
        _drop_bytecode(module)
    try:
        pid = os.fork()
        if pid == 0:
            _run_child(copy, job["args"], log, job["run"])
        _running[:] = [pid]
        deadline = started + job["timeout"]
        code: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                _kill_group(pid)
                os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        _kill_group(pid)  # whatever the tests left running in the child's group
        _running.clear()
    finally:
        if job["source"] is not None:
            module.write_text(original)
            _drop_bytecode(module)
    try:
        tail = log.read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        tail = ""
    return {
        "id": job["id"],
        "code": code,
        "seconds": time.monotonic() - started,
        "pid": pid,
        "run": job["run"],
        "tail": tail,
    }


def main() -> None:
    copy = Path.cwd().resolve()
    # The checkout's editable install puts it on sys.path too: the copy alone must be found.
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(os.environ["TXSTORE_MUTATE_REPO"])]
    sys.path.insert(0, str(copy))
    signal.signal(signal.SIGTERM, _stop)
    _preimport()
    where = _where_txstore_is_imported(copy)
    print(json.dumps({"ready": True, "txstore": where}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(run_job(copy, job)), flush=True)


if __name__ == "__main__":
    main()

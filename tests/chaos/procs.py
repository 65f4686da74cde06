"""Processes of a chaos trial, found through /proc (Linux only).

Every process the runner starts gets ``TXSTORE_CHAOS_TAG=<tag>`` in its
environment, and so does everything it starts in turn (the driver's JVM, the
PySpark daemon and its forked workers, executors of a standalone cluster via
``spark.executorEnv``). The runner finds them by that tag and kills them by
pid, also after their parent died (orphaned workers keep the tag). A Spark
Connect server's workers are found below the server's pid instead
(:func:`server_python_workers`): the server may be the tests' own, started
without a tag, and serves every trial.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

TAG_ENV = "TXSTORE_CHAOS_TAG"

# /proc/<pid>/syscall of a worker's main thread: blocked in read or poll means
# idle (waiting for the next task); running, futex (a Kafka read, the GIL) or
# clock_nanosleep (a sleep fail point inside a transaction) means mid-task.
_BUSY = {"running", "202", "230", "35"}


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    tag: str
    cmdline: str


def _read(path: str, binary: bool = False) -> bytes | str | None:
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()  # type: ignore[no-any-return]
    except (OSError, UnicodeDecodeError):
        return None


def _proc(entry: str, tag: str = "") -> Proc | None:
    """The live process ``/proc/<entry>`` (None if gone or a zombie)."""
    stat = _read(f"/proc/{entry}/stat")
    cmdline = _read(f"/proc/{entry}/cmdline", binary=True)
    if not isinstance(stat, str) or not isinstance(cmdline, bytes):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(int(entry), int(fields[1]), tag, cmdline.replace(b"\0", b" ").decode(errors="replace"))


def tagged(prefix: str) -> list[Proc]:
    """Live processes whose tag starts with ``prefix`` (not zombies)."""
    wanted = f"{TAG_ENV}={prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        environ = _read(f"/proc/{entry}/environ", binary=True)
        if not isinstance(environ, bytes) or wanted not in environ:
            continue
        tag = next(
            v.decode(errors="replace").partition("=")[2]
            for v in environ.split(b"\0")
            if v.startswith(f"{TAG_ENV}=".encode())
        )
        proc = _proc(entry, tag)
        if proc is not None:
            found.append(proc)
    return found


def _workers(procs: list[Proc]) -> list[Proc]:
    """The PySpark worker processes among ``procs``: those forked by a ``pyspark.daemon`` there."""
    daemons = {p.pid for p in procs if "pyspark.daemon" in p.cmdline}
    return [p for p in procs if p.ppid in daemons]


def python_workers(prefix: str) -> list[Proc]:
    """PySpark worker processes (forked by ``pyspark.daemon``) of tagged processes."""
    return _workers(tagged(prefix))


def descendants(root: int) -> list[Proc]:
    """Live processes below ``root`` (children, their children, ...), tagged or not: the
    Python workers of a Spark Connect server the runner did not start with a tag."""
    procs = [p for p in map(_proc, filter(str.isdigit, os.listdir("/proc"))) if p is not None]
    below, found = {root}, []
    while more := [p for p in procs if p.ppid in below and p.pid not in below]:
        found += more
        below.update(p.pid for p in more)
    return found


def server_python_workers(server_pid: int) -> list[Proc]:
    """PySpark worker processes (forked by ``pyspark.daemon``) of the server whose pid is given."""
    return _workers(descendants(server_pid))


def start_logged(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session (and process group) of its own, in ``cwd``, its output and
    errors written to the file ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )


def busy(pid: int) -> bool:
    """Whether the process's main thread is mid-task rather than waiting for one."""
    state = _read(f"/proc/{pid}/syscall")
    return isinstance(state, str) and state.split(" ", 1)[0].strip() in _BUSY


def kill(pid: int, signum: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def kill_tagged(prefix: str, rounds: int = 5) -> int:
    """SIGKILL every process tagged ``prefix*`` by pid; repeat for ones forked meanwhile."""
    killed = 0
    for _ in range(rounds):
        procs = [p for p in tagged(prefix) if p.pid != os.getpid()]
        if not procs:
            break
        for p in procs:
            with contextlib.suppress(PermissionError):
                killed += kill(p.pid)
    return killed


def handles(pid: int, signum: int) -> bool:
    """Whether the process has installed a handler for ``signum`` (SigCgt in /proc/<pid>/status)."""
    status = _read(f"/proc/{pid}/status")
    if not isinstance(status, str):
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False

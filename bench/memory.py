"""Peak memory of the driver and of Spark's Python workers, from /proc (Linux).

Peaks are the kernel's ``VmHWM`` (high-water mark of resident memory) per
process. :meth:`PeakMemory.reset` writes ``5`` to each process's
``clear_refs``, which resets that mark, so each measured batch gets its own
peak. Processes are found as descendants of this (driver) process: the JVM
(``java``) and the Python workers (``pyspark.daemon`` / ``pyspark.worker``
and the workers it forks). ``exclude``: pids left out (a broker this process started, whose
JVM is not Spark's).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

MIB = 1024 * 1024


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may contain spaces, so split after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(root: int) -> list[int]:
    tree = _children()
    found, stack = [], [root]
    while stack:
        for child in tree.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class PeakMemory:
    """Driver (this Python process and the JVM) and Python worker peaks, in MiB."""

    def __init__(self, exclude: set[int] | None = None) -> None:
        self.driver = os.getpid()
        self.exclude = set(exclude or ())
        self.reset_supported = True

    def processes(self) -> dict[str, list[int]]:
        jvm, workers = [], []
        for pid in _descendants(self.driver):
            if pid in self.exclude:
                continue
            cmd = _cmdline(pid)
            if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
                workers.append(pid)
            elif cmd.split(" ", 1)[0].endswith("java"):
                jvm.append(pid)
        return {"python_driver": [self.driver], "jvm": jvm, "python_workers": workers}

    def reset(self) -> None:
        for pids in self.processes().values():
            for pid in pids:
                try:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")
                except OSError:
                    self.reset_supported = False

    def peaks(self) -> dict[str, float | int | bool]:
        found = self.processes()
        hwm = {name: [_status_kib(pid, "VmHWM") / 1024 for pid in pids] for name, pids in found.items()}
        workers = [m for m in hwm["python_workers"] if m > 0]
        return {
            "python_driver_mib": round(max(hwm["python_driver"], default=0.0), 1),
            "jvm_mib": round(max(hwm["jvm"], default=0.0), 1),
            "python_worker_max_mib": round(max(workers, default=0.0), 1),
            "python_worker_sum_mib": round(sum(workers), 1),
            "python_workers": len(workers),
            "peaks_reset_per_measurement": self.reset_supported,
        }


def self_rss_mib() -> float:
    with contextlib.suppress(Exception):
        return _status_kib(os.getpid(), "VmRSS") / 1024
    return 0.0

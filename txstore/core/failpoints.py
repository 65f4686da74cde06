"""Named places where a test can make a task fail, stall, or its process die.

Enabled only by ``TXSTORE_FAILPOINTS`` in the driver's environment, a comma
list of ``NAME[:ACTION][@WHEN]``:

- ACTION ``raise`` (default): raise :class:`InjectedFailure` there;
  ``exit``: the process dies at once, like ``kill -9`` (exit status 137);
  ``sleep=SECONDS``: stall there, then go on (holds a transaction open, makes
  a task a straggler for speculation);
- WHEN empty: every time; ``first``: only on a Spark task's first attempt
  (driver points: always); a probability such as ``0.25``: each time, with
  that chance (drawn per process, so the moment is random).

E.g. ``after-commit@first`` (raise after COMMIT returned, on a task's first
attempt only), ``before-commit:exit@0.1``, ``between-batches:exit@0.3``.
``TXSTORE_FAILPOINTS_UNTIL`` (epoch seconds) switches them all off at that
moment, so a test can stop its faults without restarting the job. The driver
reads the variables once and ships the parsed set with each task, so it works
on any cluster. When ``TXSTORE_FAILPOINTS`` is unset the set is empty and each
check returns at once.

Task names (in the sink): ``before-upsert``, ``between-upsert-and-offsets``,
``before-commit``, ``after-commit``; in a task of ``readStream.format("txstore")`` (its
``txstore.failpoints`` option): ``after-first-range``, once the task has read its first range; in
that source's planner: ``before-stream-relock``, connected again after its PostgreSQL session
ended, before it takes the job's stream lock again. Driver names (in the job loop):
``after-plan`` (between planning a batch and running it),
``between-batches`` (after a batch, before waiting for the next) and ``spark-started`` (in a
job run from the command line: its SparkSession just made, before the batch goes on).
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass

FAILPOINTS_ENV = "TXSTORE_FAILPOINTS"
UNTIL_ENV = "TXSTORE_FAILPOINTS_UNTIL"
TASK_NAMES = frozenset(
    {"before-upsert", "between-upsert-and-offsets", "before-commit", "after-commit", "after-first-range"}
)
DRIVER_NAMES = frozenset({"after-plan", "between-batches", "spark-started"})
STREAM_PLANNER_NAMES = frozenset({"before-stream-relock"})
NAMES = TASK_NAMES | DRIVER_NAMES | STREAM_PLANNER_NAMES
EXIT_STATUS = 137


class InjectedFailure(RuntimeError):
    """Raised at an enabled fail point (tests only)."""


@dataclass(frozen=True)
class FailPoint:
    name: str
    action: str = "raise"  # "exit": the process dies at once, like kill -9; "sleep": stall, go on
    first_attempt_only: bool = False
    probability: float = 1.0
    sleep_seconds: float = 0.0

    @classmethod
    def parse(cls, item: str) -> FailPoint:
        spec, _, when = item.partition("@")
        name, _, action = (part.strip() for part in spec.partition(":"))
        when = when.strip()
        sleep_seconds = 0.0
        if action.startswith("sleep="):
            sleep_seconds = _number(action.removeprefix("sleep="), item, low=0.0, high=3600.0)
            action = "sleep"
        elif action not in ("", "raise", "exit"):
            raise _error(item, "actions: raise, exit, sleep=SECONDS")
        if name not in NAMES:
            raise _error(item, f"names: {', '.join(sorted(NAMES))}")
        probability = 1.0
        if when not in ("", "first"):
            probability = _number(when, item, low=0.0, high=1.0)
        return cls(name, action or "raise", when == "first", probability, sleep_seconds)

    def fires(self, attempt: int) -> bool:
        if self.first_attempt_only and attempt != 0:
            return False
        return self.probability >= 1.0 or random.random() < self.probability


def _error(item: str, hint: str) -> ValueError:
    return ValueError(f"{FAILPOINTS_ENV}: cannot parse {item!r}; expected NAME[:ACTION][@WHEN], {hint}")


def _number(text: str, item: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _error(item, f"expected a number from {low:g} to {high:g}, got {text!r}") from None
    if not low <= value <= high:
        raise _error(item, f"expected a number from {low:g} to {high:g}, got {text!r}")
    return value


@dataclass(frozen=True)
class FailPoints:
    points: tuple[FailPoint, ...] = ()
    until: float | None = None  # epoch seconds after which nothing fires

    @classmethod
    def from_env(cls) -> FailPoints:
        points = cls.parse(os.environ.get(FAILPOINTS_ENV, ""))
        until = os.environ.get(UNTIL_ENV, "").strip()
        if not until:
            return points
        try:
            return cls(points.points, float(until))
        except ValueError:
            raise ValueError(f"{UNTIL_ENV}: expected epoch seconds, got {until!r}") from None

    @classmethod
    def parse(cls, text: str) -> FailPoints:
        return cls(
            tuple(FailPoint.parse(item) for item in filter(None, (p.strip() for p in text.split(","))))
        )

    def hit(self, name: str, attempt: int = 0) -> None:
        """Fail (or stall) here if ``name`` is enabled for this task attempt."""
        if not self.points or (self.until is not None and time.time() >= self.until):
            return
        for point in self.points:
            if point.name == name and point.fires(attempt):
                # One line per firing, so a test can tell what was injected where.
                print(
                    f"txstore fail point {name}: {point.action} (attempt {attempt})",
                    file=sys.stderr,
                    flush=True,
                )
                if point.action == "sleep":
                    time.sleep(point.sleep_seconds)
                    continue
                if point.action == "exit":
                    os._exit(EXIT_STATUS)
                raise InjectedFailure(f"fail point {name} (attempt {attempt})")

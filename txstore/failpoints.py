"""Named places where a test can make a task fail or its process die.

Enabled only by ``TXSTORE_FAILPOINTS`` in the driver's environment, e.g.
``after-commit@first`` (raise after COMMIT returned, on a task's first
attempt only) or ``before-commit:exit`` (the worker process dies). The driver
reads the variable once and ships the parsed set with each task, so it works
on any cluster. When the variable is unset the set is empty and each check is
one membership test.

Names: ``before-upsert``, ``between-upsert-and-offsets``, ``before-commit``,
``after-commit``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FAILPOINTS_ENV = "TXSTORE_FAILPOINTS"
NAMES = frozenset({"before-upsert", "between-upsert-and-offsets", "before-commit", "after-commit"})


class InjectedFailure(RuntimeError):
    """Raised at an enabled fail point (tests only)."""


@dataclass(frozen=True)
class FailPoint:
    name: str
    action: str = "raise"  # or "exit": the process dies at once, like kill -9
    first_attempt_only: bool = False


@dataclass(frozen=True)
class FailPoints:
    points: tuple[FailPoint, ...] = ()

    @classmethod
    def from_env(cls) -> FailPoints:
        return cls.parse(os.environ.get(FAILPOINTS_ENV, ""))

    @classmethod
    def parse(cls, text: str) -> FailPoints:
        points = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            spec, _, when = item.partition("@")
            name, _, action = spec.partition(":")
            if name not in NAMES or action not in ("", "raise", "exit") or when not in ("", "first"):
                raise ValueError(f"{FAILPOINTS_ENV}: cannot parse {item!r}; names: {sorted(NAMES)}")
            points.append(FailPoint(name, action or "raise", when == "first"))
        return cls(tuple(points))

    def hit(self, name: str, attempt: int = 0) -> None:
        """Fail here if ``name`` is enabled for this task attempt."""
        for point in self.points:
            if point.name == name and (attempt == 0 or not point.first_attempt_only):
                if point.action == "exit":
                    os._exit(137)
                raise InjectedFailure(f"fail point {name} (attempt {attempt})")

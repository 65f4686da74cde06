"""pytest plugin for the mutation run only (``./dev mutate`` passes it to each run).

- Tests that would start Spark, a Connect server, a cluster or Tansu are deselected: a
  module's test selection must stay fast, and such a test must not slip in by a ``-k``.
- With ``TXSTORE_MUTATE_TEMPLATE`` (a database the runner migrated once, with the copy's
  migrations), the tests' session template database is created from it instead of being
  migrated again by Alembic in every run; the tests still get a fresh database each.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

SLOW_FIXTURES = {"spark", "spark_connect", "spark_connect_server", "any_spark", "tansu"}
SLOW_MARKS = {"spark", "connect", "cluster", "chaos", "fresh_clone"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = [
        item
        for item in items
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
        or any(item.get_closest_marker(mark) for mark in SLOW_MARKS)
    ]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


def _premigrated_templates() -> None:
    template = os.environ.get("TXSTORE_MUTATE_TEMPLATE")
    if not template:
        return
    from pytest_postgresql.janitor import DatabaseJanitor

    init, load = DatabaseJanitor.init, DatabaseJanitor.load

    def fast_init(self: Any) -> None:
        if self.is_template() and not self.template_dbname and self.dbname.startswith("txstore_test_"):
            self.template_dbname = template
            self.premigrated = True
        init(self)

    def fast_load(self: Any, what: Any) -> None:
        if not getattr(self, "premigrated", False):
            load(self, what)

    DatabaseJanitor.init = fast_init  # type: ignore[method-assign]
    DatabaseJanitor.load = fast_load  # type: ignore[method-assign,assignment]


_premigrated_templates()

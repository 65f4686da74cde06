"""Topic names for the tests' brokers."""

from __future__ import annotations

import itertools
import os

_topic_numbers = itertools.count()


def topic_name(prefix: str) -> str:
    """A topic name no other test of this process takes, on any broker: the mock's topics
    (``new_topic``) and ``new_any_topic``'s share one counter, since a test's ``any_kafka`` runs
    on the same mock broker as the others (two counters had two tests create ``results-PID-1``
    there: "Topic already exists")."""
    return f"{prefix}-{os.getpid()}-{next(_topic_numbers)}"

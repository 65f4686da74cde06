"""Sums are exact: no binary floats and no 28-digit Decimal rounding, however ranges are grouped."""

from __future__ import annotations

import importlib.util
import random
from decimal import Context, Decimal, localcontext
from typing import Any

import pytest

from tests.conftest import REPO, send
from tests.e2e.test_aggregates import stored
from tests.helpers.counting import Counting
from txstore import JobSettings, TransactionalJob
from txstore.core.results import add_metrics, metric_text


def load_sum_field() -> Any:
    spec = importlib.util.spec_from_file_location("sum_field_example", REPO / "jobs" / "sum_field.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sum_field


def test_adding_a_decimal_to_zero_keeps_every_digit() -> None:
    x = Decimal("1234567890.12345678901234567890123456789")
    assert add_metrics(0, x) == x
    assert add_metrics(x, x) == Decimal("2469135780.24691357802469135780246913578")


def test_floats_are_added_as_the_decimals_of_their_repr() -> None:
    total = add_metrics(add_metrics(0, 0.1), 0.2)
    assert total == Decimal("0.3")
    assert add_metrics(0.1, 0.2) == Decimal("0.3")
    assert add_metrics(1e300, 1) == Decimal(10**300 + 1)  # Decimal("1E+300") + 1 would round
    assert metric_text(add_metrics(2, 3)) == "5"  # ints stay ints


def amount_text(rng: random.Random) -> str:
    """A decimal of 34 significant digits, as exact JSON number text."""
    return f"{rng.randrange(10**21, 10**22)}.{rng.randrange(10**11, 10**12)}"


@pytest.mark.spark
@pytest.mark.parametrize("commit", ["per-range", "per-batch"])
def test_sums_of_34_digit_amounts_are_exact_when_ranges_share_tasks(commit: str, counting: Counting) -> None:
    # 12 partitions on 2 cores: ranges share tasks (per-range) or are summed by a shuffle (per-batch).
    partitions = 12
    topic = counting.new_topic(partitions)
    rng = random.Random(5)
    texts = [amount_text(rng) for _ in range(1200)]
    keys = [rng.choice([b"a", b"b", b"c"]) for _ in texts]
    send(
        counting.kafka.bootstrap_servers,
        topic,
        (
            (i % partitions, key, b'{"amount": ' + text.encode() + b"}", None)
            for i, (key, text) in enumerate(zip(keys, texts, strict=True))
        ),
    )
    with localcontext(Context(prec=100)):
        want_total = sum((Decimal(t) for t in texts), Decimal(0))
        want_keys: dict[str, Decimal] = {}
        for key, text in zip(keys, texts, strict=True):
            want_keys[key.decode()] = want_keys.get(key.decode(), Decimal(0)) + Decimal(text)
    settings = JobSettings(
        "sums", (topic,), counting.kafka.bootstrap_servers, counting.database_url, commit=commit
    )
    with TransactionalJob(counting.spark, settings, load_sum_field()("amount")) as job:
        job.run_batch()
    rows = stored(counting.db, "sums", topic)
    assert rows.pop(("topic", None, None)) == want_total
    assert rows == {("key", k, None): v for k, v in want_keys.items()}
    assert counting.offsets(topic, "sums") == counting.log_ends(topic)

from __future__ import annotations

from typing import Any

import pytest

import txstore


@pytest.fixture
def session(request: pytest.FixtureRequest) -> Any:
    """The classic session, or (``@CLASSIC_AND_CONNECT``, tests/helpers/streams.py) also a Spark
    Connect client, whose source and sink run on the server; registered, so the source's default
    txstore.tasks is its parallelism."""
    spark = request.getfixturevalue(
        "spark_connect" if getattr(request, "param", "") == "connect" else "spark"
    )
    txstore.register(spark)
    return spark

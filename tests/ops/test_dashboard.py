"""ops/grafana/txstore.json: a well-formed Grafana dashboard whose every query asks for metrics a job exports."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import REPO, produce
from tests.ops.test_metrics import scrape
from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.producers import close_producers
from txstore.testing.mock_kafka import MockKafkaCluster

DASHBOARD = REPO / "ops" / "grafana" / "txstore.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

FUNCTIONS = frozenset(
    {"rate", "irate", "increase", "delta", "histogram_quantile", "time", "abs", "clamp_min", "vector"}
    | {"sum", "max", "min", "avg", "count", "topk", "bottomk"}
)
"""The PromQL functions and aggregations the dashboard may use (an unknown one fails the test)."""
MODIFIERS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    A small lexer, enough for the dashboard's queries: strings, label matchers
    ``{..}``, range selectors ``[..]`` and grouping modifiers ``by (..)`` are
    dropped; a name followed by ``(`` must be a known function; what is left
    is a metric name. Unbalanced brackets fail.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for opening, closing in ("()", "{}", "[]"):
        depth = 0
        for char in text:
            depth += (char == opening) - (char == closing)
            assert depth >= 0, f"unbalanced {closing!r} in {expr!r}"
        assert depth == 0, f"unbalanced {opening!r} in {expr!r}"
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = MODIFIERS.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        if text[match.end() :].lstrip().startswith("("):
            assert word in FUNCTIONS, f"unknown PromQL function {word!r} in {expr!r}"
        elif word not in KEYWORDS:
            names.add(word)
    return names


def family(sample_name: str) -> str:
    for suffix in (*HISTOGRAM_SUFFIXES, "_total"):
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


def test_the_lexer_finds_the_metrics_and_refuses_what_it_cannot_read() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (job, le) (rate(a_bucket{job=~"$job", le!="x{"}[$__rate_interval])))'
    ) == {"a_bucket"}
    assert metric_names('time() - max by (job) (b{job=~"$job"}) / ignoring(x) c_total offset 5m') == {
        "b",
        "c_total",
    }
    with pytest.raises(AssertionError, match="unknown PromQL function 'ratee'"):
        metric_names("ratee(a[5m])")
    with pytest.raises(AssertionError, match="unbalanced"):
        metric_names("sum(rate(a[5m])")


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable() -> None:
    board = dashboard()
    assert board["title"] == "txstore" and board["uid"]
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["job"]["datasource"] == DATASOURCE
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p["datasource"] == DATASOURCE, p["title"]
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE
            assert 'job=~"$job"' in t["expr"], t["expr"]  # every query follows the job picker
            assert metric_names(t["expr"]), t["expr"]
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "lag", "batch duration", "commit duration", "conflicts", "last commit"):
        assert topic in titles


@pytest.mark.spark
def test_every_metric_the_dashboard_queries_is_one_a_real_job_exports_and_it_shows_them_all(
    spark: Any, kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic, results = new_topic(2), new_topic(1, prefix="results")
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4})
    settings = JobSettings(
        "count_topic",
        (topic,),
        kafka.bootstrap_servers,
        database_url,
        on_bad_message="skip",  # every optional metric on
        publish_topic=results,
        metrics_port=0,
    )
    try:
        with TransactionalJob(spark, settings, CountMessages()) as job:
            job.run_batch()
            _, samples = scrape(job)
    finally:
        close_producers()
    exported = {name for name, _ in samples}
    queried = set().union(*(metric_names(e) for e in exprs()))
    assert queried - exported == set()
    # Histograms are queried by their buckets (quantiles), and every family the job exports is shown.
    assert {"txstore_batch_duration_seconds_bucket", "txstore_commit_duration_seconds_bucket"} <= queried
    shown = {family(n) for n in queried}
    assert {family(n) for n in exported if not n.endswith("_created")} - shown == set()

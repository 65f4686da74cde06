"""What a Spark worker needs installed: the README's list, and nothing else.

README section 5 says that with ``--py-files`` the workers "only need the
dependencies (pyspark, psycopg, confluent-kafka, pyarrow, pandas)". The
project's other dependencies are the driver's: SQLAlchemy and Alembic (schema
and migrations) and prometheus_client (``--metrics-port``). A task that imports
one fails in its first batch on such a worker (``No module named 'sqlalchemy'``).

The check here is the cheaper one the issue allows instead of a cluster whose
executors have a venv of exactly those packages: the functions the job sends
to its tasks are pickled here as PySpark pickles them (cloudpickle), then, in a
Python whose import system refuses those three, unpickled
(which imports every module they name, the ``txstore`` package first) and run
over a mock Kafka topic and a migrated database, as a worker runs them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark import cloudpickle

from tests.conftest import REPO, send
from tests.helpers.counting import BrokerDb
from tests.postgres.test_sink import seed
from txstore.core.ranges import OffsetRange
from txstore.count_topic import count_messages
from txstore.kafka.client_settings import client_config
from txstore.spark.ranges.range_task import RangeTask
from txstore.spark.ranges.tasks import _EachGroup, _RangeBatches

DRIVER_ONLY = ("sqlalchemy", "alembic", "prometheus_client")

WORKER = f"""
import pickle, sys
import importlib.abc

class DriverOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {DRIVER_ONLY!r}:
            raise ImportError(f"No module named {{name!r}} (not on the workers)")
        return None

sys.meta_path.insert(0, DriverOnly())
import pyarrow as pa

ids = [pa.RecordBatch.from_pydict({{"id": [0]}})]
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        function = pickle.load(f)
    rows = sum(batch.num_rows for batch in function(iter(ids)))
    print(type(function).__name__, rows)
loaded = sorted(name for name in sys.modules if name.split(".")[0] in {DRIVER_ONLY!r})
assert not loaded, loaded
"""


@pytest.mark.slow
def test_the_functions_tasks_run_need_none_of_the_driver_only_dependencies(
    tmp_path: Path, broker_db: BrokerDb
) -> None:
    topic = broker_db.new_topic(1)
    send(broker_db.kafka.bootstrap_servers, topic, [(0, b"k", b"v", None)] * 7)
    seed(broker_db.db, "w", topic, {0: 0})
    conf = client_config(broker_db.kafka.bootstrap_servers)
    groups = [[OffsetRange(topic, 0, 0, 7)]]
    functions = {
        "count.pickle": _EachGroup(groups, RangeTask("w", broker_db.database_url, conf, count_messages)),
        "read.pickle": _RangeBatches(groups, conf, job="w"),
    }
    for name, function in functions.items():
        (tmp_path / name).write_bytes(cloudpickle.dumps(function))
    result = subprocess.run(
        [sys.executable, "-c", WORKER, *(str(tmp_path / name) for name in functions)],
        cwd=tmp_path,  # not the checkout: txstore comes from the installed package, as --py-files
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["_EachGroup 1", "_RangeBatches 7"]  # one report; 7 messages
    assert broker_db.totals(topic, job="w") == {topic: 7}

"""txstore installed like a library: the wheel, in fresh venvs, with no checkout on the path.

Once per session (each takes a minute or more on the 2-core test machine): ``python -m build``
makes the sdist and, from it, the wheel (in a copy of the checkout, which stays clean), and
pip installs the wheel with its dependencies into a fresh venv. Everything the tests run
then runs from that venv, in a temporary folder, with no PYTHONPATH: ``txstore db upgrade``
migrates a fresh database, ``python -m txstore.count_topic`` and ``spark-submit "$(txstore
job-file count_topic)"`` count a topic, and on the standalone cluster (tests/e2e/test_cluster.py)
the executors' Python has txstore only from what the job ships: the wheel itself on
``--py-files``, or a packed environment (venv-pack) on ``--archives``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import REPO, produce
from tests.helpers.counting import BrokerDb, assert_counted_exactly
from tests.helpers.job_processes import count_topic_args, job_env, kill_group, python_without_txstore
from tests.helpers.standalone import Standalone
from txstore import __version__
from txstore.postgres.migrate import SCHEMA_REVISION
from txstore.testing.mock_kafka import MockKafkaCluster

# The first test of a session also builds the wheel and installs it (minutes on a loaded machine),
# and pytest-timeout counts a test's fixtures in its time.
pytestmark = [pytest.mark.wheel, pytest.mark.timeout(1800)]

BUILD_TIMEOUT = 600.0
INSTALL_TIMEOUT = 900.0
JOB_TIMEOUT = 300.0
CLUSTER_JOB_TIMEOUT = 600.0  # the wheel on --py-files took 250 s at a load of 9; an archive unpacks too
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", "site", ".*_cache"
)


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Installed:
    """A fresh venv with the wheel and its dependencies, and nothing of the checkout."""

    prefix: Path
    wheel: Path

    @property
    def python(self) -> str:
        return str(self.prefix / "bin" / "python")

    def bin(self, name: str) -> str:
        return str(self.prefix / "bin" / name)


def run(command: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{command[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``python -m build``: the sdist, then the wheel built from it."""
    work = tmp_path_factory.mktemp("build")
    source = work / "txstore"
    shutil.copytree(REPO, source, ignore=NOT_COPIED)
    dist = work / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], BUILD_TIMEOUT, cwd=work)
    [wheel] = dist.glob(f"txstore-{__version__}-py3-none-any.whl")
    [sdist] = dist.glob(f"txstore-{__version__}.tar.gz")
    return Built(wheel, sdist)


def fresh_env() -> dict[str, str]:
    """The environment of a process that must not see this checkout or the test venv."""
    env = job_env()
    for name in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="session")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, pip-installed with its dependencies into a fresh venv."""
    prefix = tmp_path_factory.mktemp("installed") / "venv"
    venv.EnvBuilder(with_pip=True).create(prefix)
    python = str(prefix / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, str(built.wheel)], INSTALL_TIMEOUT, cwd=prefix, env=fresh_env())
    return Installed(prefix, built.wheel)


def in_venv(installed: Installed, **extra: str) -> dict[str, str]:
    env = fresh_env()
    env["PATH"] = f"{installed.prefix / 'bin'}{os.pathsep}{env['PATH']}"
    env.update({"PYSPARK_PYTHON": installed.python, "PYSPARK_DRIVER_PYTHON": installed.python, **extra})
    return env


def test_the_wheel_and_the_sdist_carry_the_migrations_and_the_job_files(built: Built) -> None:
    import tarfile

    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
    revisions = sorted(p.name for p in (REPO / "txstore" / "migrations" / "versions").glob("*.py"))
    assert revisions[-1].startswith(SCHEMA_REVISION)
    shipped = {
        "txstore/migrations/env.py",
        "txstore/migrations/script.py.mako",
        "txstore/jobs/count_topic.py",
        "txstore/jobs/aggregate.py",
        "txstore/py.typed",
        "txstore/spark/runtime/log4j2-quiet.properties",
        "txstore/spark/stream/stream_sink.py",  # the subpackages of spark and postgres
        "txstore/spark/ranges/range_task.py",
        "txstore/spark/source/datasource.py",
        "txstore/spark/runtime/quiet.py",
        "txstore/postgres/results/results_table.py",
        *(f"txstore/migrations/versions/{name}" for name in revisions),
    }
    assert shipped <= names, sorted(shipped - names)
    with tarfile.open(built.sdist) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert shipped | {"pyproject.toml"} <= in_sdist


def test_an_installed_wheel_migrates_a_fresh_database_and_counts_a_topic_from_another_folder(
    installed: Installed,
    kafka: MockKafkaCluster,
    empty_database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    env = in_venv(installed)
    where = run(
        [installed.python, "-c", "import txstore, sys; print(txstore.__file__); print(sys.path)"],
        60,
        cwd=tmp_path,
        env=env,
    ).stdout
    assert where.startswith(str(installed.prefix)), where
    assert str(REPO) not in where, where
    version = run([installed.bin("txstore"), "--version"], 60, cwd=tmp_path, env=env)
    assert version.stdout == f"txstore {__version__}\n"

    up = run(
        [installed.bin("txstore"), "db", "upgrade", "--database-url", empty_database_url],
        120,
        cwd=tmp_path,
        env=env,
    )
    assert up.stdout.endswith(f"to {SCHEMA_REVISION} (head)\n"), up.stdout
    assert up.stderr == ""

    topic = new_topic(3)
    produce(kafka.bootstrap_servers, topic, {0: 400, 1: 300, 2: 200})
    job = run(
        [
            installed.python,
            "-m",
            "txstore.count_topic",
            *count_topic_args(kafka, empty_database_url, topic, "--once"),
        ],
        JOB_TIMEOUT,
        cwd=tmp_path,
        env=env,
    )
    assert "batch 1: 3 ranges, 900 messages" in job.stderr, job.stderr[-3000:]
    assert "Traceback" not in job.stderr
    with psycopg.connect(empty_database_url, autocommit=True) as db:
        assert_counted_exactly(db, kafka, topic, 900)


def test_spark_submit_runs_the_job_file_the_installed_package_names(
    installed: Installed, broker_db: BrokerDb, tmp_path: Path
) -> None:
    env = in_venv(installed)
    path = run(
        [installed.bin("txstore"), "job-file", "count_topic"], 60, cwd=tmp_path, env=env
    ).stdout.strip()
    assert Path(path).is_file() and Path(path).is_relative_to(installed.prefix), path
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 250, 1: 150})
    job = run(
        [
            installed.bin("spark-submit"),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            path,
            *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once"),
        ],
        JOB_TIMEOUT,
        cwd=tmp_path,
        env=env,
    )
    # spark-submit passes the Python driver's stderr on to its own stdout
    assert "batch 1: 2 ranges, 400 messages" in job.stdout, job.stdout[-3000:]
    assert broker_db.totals(topic) == {topic: 400}
    unknown = subprocess.run(
        [installed.bin("txstore"), "job-file", "nope"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "invalid choice: 'nope' (choose from" in unknown.stderr.splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# Shipping to a cluster: executors whose Python has nothing of txstore but what the job ships


@pytest.fixture(scope="session")
def packed(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv-pack archive of a venv with the wheel and its dependencies but pyspark, which the
    cluster's Spark gives every Python worker (Spark's own venv-pack recipe)."""
    import venv_pack  # type: ignore[import-untyped]

    work = tmp_path_factory.mktemp("packed")
    prefix = work / "venv"
    venv.EnvBuilder(with_pip=True).create(prefix)
    with zipfile.ZipFile(installed.wheel) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        ]
    requires = [r for r in requires if not r.startswith("pyspark")]
    pip = [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, "--no-deps", str(installed.wheel)], INSTALL_TIMEOUT, cwd=work, env=fresh_env())
    run([*pip, *requires], INSTALL_TIMEOUT, cwd=work, env=fresh_env())
    output = work / "environment.tar.gz"
    venv_pack.pack(prefix=str(prefix), output=str(output), compress_level=1)
    return output


def submit_to(cluster: Standalone, *args: str, env: dict[str, str], cwd: Path) -> str:
    """spark-submit to the standalone master (client mode); the run's output, after it exited 0."""
    out = cwd / "submit.log"
    with out.open("w") as log:
        job = cluster.submit(*args, env=env, cwd=cwd, log=log)
    try:
        code: int | None = job.wait(timeout=CLUSTER_JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_group(job)
    text = out.read_text()
    assert code == 0, (
        f"spark-submit exited {code} (None: still running after {CLUSTER_JOB_TIMEOUT:g}s)\n{text[-8000:]}"
    )
    return text


@pytest.mark.spark
@pytest.mark.cluster
def test_the_wheel_itself_on_py_files_ships_txstore_to_a_cluster_whose_python_lacks_it(
    installed: Installed, standalone: Standalone, broker_db: BrokerDb, tmp_path: Path
) -> None:
    python = python_without_txstore(tmp_path)  # the driver's and the executors': no txstore
    job = tmp_path / "count_topic.py"
    shutil.copyfile(
        run(
            [installed.bin("txstore"), "job-file", "count_topic"], 60, cwd=tmp_path, env=in_venv(installed)
        ).stdout.strip(),
        job,
    )
    topic = broker_db.new_topic(3)
    broker_db.produce(topic, {0: 700, 1: 500, 2: 300})
    log = submit_to(
        standalone,
        "--py-files",
        str(installed.wheel),
        str(job),
        *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once"),
        env={"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
        cwd=tmp_path,
    )
    assert "batch 1: 3 ranges, 1500 messages" in log, log[-5000:]
    broker_db.assert_counted_exactly(topic, 1500)


@pytest.mark.spark
@pytest.mark.cluster
def test_a_packed_environment_on_archives_is_the_python_of_the_executors(
    installed: Installed, packed: Path, standalone: Standalone, broker_db: BrokerDb, tmp_path: Path
) -> None:
    env = in_venv(installed, PYSPARK_PYTHON="./environment/bin/python")
    job = run([installed.bin("txstore"), "job-file", "count_topic"], 60, cwd=tmp_path, env=env).stdout.strip()
    topic = broker_db.new_topic(3)
    broker_db.produce(topic, {0: 600, 1: 400, 2: 200})
    log = submit_to(
        standalone,
        "--archives",
        f"{packed}#environment",
        job,
        *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once"),
        env={k: env[k] for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")},
        cwd=tmp_path,
    )
    assert "batch 1: 3 ranges, 1200 messages" in log, log[-5000:]
    assert broker_db.totals(topic) == {topic: 1200}
    # The executor ran in its application folder, where the archive was unpacked as ./environment.
    unpacked = list(Path(standalone.env["SPARK_WORKER_DIR"]).glob("app-*/*/environment/bin/python"))
    assert unpacked, "no executor unpacked the archive"

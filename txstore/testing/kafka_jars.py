"""Apache Kafka's jars for the test broker, fetched once from Maven Central.

:func:`kafka_jars` has Maven copy ``org.apache.kafka:kafka_2.13`` (:data:`KAFKA_VERSION`) and
its runtime dependencies, plus an SLF4J provider, into ``~/.cache/txstore/kafka-VERSION/libs``
(``TXSTORE_KAFKA_CACHE`` replaces ``~/.cache/txstore``; :func:`cache_root`). Without Maven, or
offline with an empty cache, it raises :class:`KafkaJarsUnavailable` with one line.
:func:`maven_dependencies` is the fetch itself, shared with the benchmark's Spark Kafka jars
(``bench/spark_kafka_jars.py``): safe from several processes at once, a copy renamed into place
whole.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

KAFKA_VERSION = "4.1.2"
"""The Apache Kafka release the tests run (``org.apache.kafka:kafka_2.13``)."""
LOG4J_VERSION = "2.25.3"  # the log4j-core Kafka 4.1.2 depends on; its SLF4J 1.7 provider
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT_SECONDS = 300.0  # within pytest-timeout's 600 s for the test whose fixture fetches
CACHE_ENV = "TXSTORE_KAFKA_CACHE"
_COMPLETE = ".complete"  # written last into libs/: the copy is whole

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txstore.testing</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


class KafkaJarsUnavailable(RuntimeError):
    """Kafka's jars are not cached and Maven cannot fetch them (not installed, or offline)."""

    not_published = False  # Maven Central has no such artifact (asking again will not help)


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "txstore"


def _first_error(output: str) -> str:
    """Maven's first ``[ERROR]`` line without its prefix or colours (else its last line)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("[ERROR]"):
            return line.removeprefix("[ERROR]").strip().removesuffix("-> [Help 1]").strip()
    return lines[-1] if lines else "no output"


def kafka_jars(version: str = KAFKA_VERSION, timeout: float = FETCH_TIMEOUT_SECONDS) -> Path:
    """The directory of Kafka ``version``'s jars, fetched by Maven the first time.

    Raises :class:`KafkaJarsUnavailable` with one line when the jars are not cached and Maven
    is missing or fails (:func:`maven_dependencies`).
    """
    return maven_dependencies(
        cache_root() / f"kafka-{version}",
        _POM.format(kafka=version, log4j=LOG4J_VERSION),
        f"Kafka {version}'s jars (org.apache.kafka:kafka_2.13:{version})",
        "kafka_2.13-",
        timeout,
    )


def maven_dependencies(home: Path, pom: str, what: str, expected: str, timeout: float) -> Path:
    """``home/libs``: the runtime dependencies of ``pom``, copied there by Maven the first time.

    Safe to call from several processes at once (a lock file in ``home``; the copy is renamed
    into place whole, marked complete last). A jar whose name starts with ``expected`` must be
    among them. Raises :class:`KafkaJarsUnavailable` in one line naming ``what`` when Maven is
    missing, takes longer than ``timeout`` or fails (its output kept in ``home/mvn.log``;
    ``not_published`` set when Maven Central has no such artifact).
    """
    libs = home / "libs"
    if (libs / _COMPLETE).exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsUnavailable(
            f"{what} are not in {libs} and Maven (mvn) is not on PATH to fetch them; "
            "install it (apt-get install maven)"
        )
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching: wait for it
        if (libs / _COMPLETE).exists():
            return libs
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            (work / "pom.xml").write_text(pom)
            command = [
                mvn,
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(work / "pom.xml"),
                f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={work / 'libs'}",
                "-DincludeScope=runtime",
            ]
            log = home / "mvn.log"
            try:
                done = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise KafkaJarsUnavailable(
                    f"Maven did not fetch {what} within {timeout:g} s; is Maven Central reachable?"
                ) from None
            log.write_text(done.stdout)
            jars = sorted((work / "libs").glob("*.jar")) if (work / "libs").is_dir() else []
            if done.returncode != 0 or not any(j.name.startswith(expected) for j in jars):
                error = KafkaJarsUnavailable(
                    f"Maven could not fetch {what} (exit {done.returncode}, output in {log}): "
                    f"{_first_error(done.stdout)}"
                )
                error.not_published = (
                    "Could not find artifact" in done.stdout or "was not found in" in done.stdout
                )
                raise error
            (work / "libs" / _COMPLETE).write_text("".join(f"{j.name}\n" for j in jars))
            if libs.exists():
                shutil.rmtree(libs)  # an incomplete copy left by a killed fetch
            (work / "libs").rename(libs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs

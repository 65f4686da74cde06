"""Spark's own Kafka source (``spark-sql-kafka-0-10``) for the race, fetched once by Maven.

:func:`spark_kafka_jars` has Maven copy ``org.apache.spark:spark-sql-kafka-0-10_2.13`` and its
runtime dependencies into ``~/.cache/txstore/spark-kafka-VERSION/libs`` (the cache
:func:`txstore.testing.real_kafka.cache_root` names), keeps only the jars PySpark does not
ship itself (an artifact already in ``pyspark/jars``, at any version, is left out: scala-library,
slf4j, lz4, snappy, hadoop-client, spark-tags, ...), and returns them for ``spark.jars``.
Never ``--packages`` at run time.

The version is the installed PySpark's; when Maven Central has no connector of that version
(PySpark 4.3.0's is not published there), the newest published release of the same major
version below it is taken, and the run records which one (:data:`SparkKafkaJars.version`).
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from txstore.testing.real_kafka import (
    FETCH_TIMEOUT_SECONDS,
    KafkaJarsUnavailable,
    cache_root,
    maven_dependencies,
)

ARTIFACT = "spark-sql-kafka-0-10_2.13"
METADATA_URL = f"https://repo.maven.apache.org/maven2/org/apache/spark/{ARTIFACT}/maven-metadata.xml"
_COMPLETE = ".complete"
_MISSING = ".not-published"
MISSING_SECONDS = 86_400.0
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txstore.bench</groupId>
  <artifactId>spark-kafka</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


@dataclass(frozen=True)
class SparkKafkaJars:
    version: str  # the connector's version
    pyspark_version: str
    jars: tuple[Path, ...]

    @property
    def spark_jars(self) -> str:
        """The value for ``spark.jars``: the local files, comma-separated."""
        return ",".join(str(j) for j in self.jars)


def _artifact_name(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$", "", jar)


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def published_fallback(wanted: str, timeout: float = 30.0) -> str | None:
    """The newest final release on Maven Central of the same major version, not above ``wanted``."""
    try:
        with urllib.request.urlopen(METADATA_URL, timeout=timeout) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    finals = [v for v in re.findall(r"<version>([^<]+)</version>", text) if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    same = [v for v in finals if v.split(".")[0] == wanted.split(".")[0] and _key(v) <= _key(wanted)]
    return max(same, key=_key) if same else None


def _fetch(version: str, timeout: float) -> Path:
    home = cache_root() / f"spark-kafka-{version}"
    missing = home / _MISSING
    fresh_miss = missing.exists() and time.time() - missing.stat().st_mtime < MISSING_SECONDS
    if fresh_miss and not (home / "libs" / _COMPLETE).exists():
        raise KafkaJarsUnavailable(missing.read_text().strip())
    try:
        return maven_dependencies(
            home,
            _POM.format(artifact=ARTIFACT, version=version),
            f"Spark's Kafka source (org.apache.spark:{ARTIFACT}:{version})",
            ARTIFACT,
            timeout,
        )
    except KafkaJarsUnavailable as e:
        if e.not_published:
            missing.write_text(f"{e}\n")  # not published: do not ask again for a day
        raise


def spark_kafka_jars(version: str | None = None, timeout: float = FETCH_TIMEOUT_SECONDS) -> SparkKafkaJars:
    """The connector's jars that PySpark lacks; raises :class:`KafkaJarsUnavailable` in one line."""
    pyspark_version, pyspark_jars = _pyspark()
    wanted = version or pyspark_version
    try:
        libs = _fetch(wanted, timeout)
    except KafkaJarsUnavailable:
        if version is not None:
            raise
        cached = sorted(
            (
                p.parent.parent.name.removeprefix("spark-kafka-")
                for p in cache_root().glob(f"spark-kafka-*/libs/{_COMPLETE}")
            ),
            key=_key,
        )
        fallback = next((v for v in reversed(cached) if _key(v) <= _key(wanted)), None)
        fallback = fallback or published_fallback(wanted)
        if fallback is None or fallback == wanted:
            raise
        wanted, libs = fallback, _fetch(fallback, timeout)
    shipped = {_artifact_name(j.name) for j in pyspark_jars.glob("*.jar")}
    jars = tuple(j for j in sorted(libs.glob("*.jar")) if _artifact_name(j.name) not in shipped)
    return SparkKafkaJars(wanted, pyspark_version, jars)


if __name__ == "__main__":
    found = spark_kafka_jars()
    print(f"connector {found.version} for PySpark {found.pyspark_version}:")
    for jar in found.jars:
        print(f"  {jar}")

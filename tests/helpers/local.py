"""This machine: the pip-installed Spark's home, and a free TCP port on 127.0.0.1."""

from __future__ import annotations

import socket
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""What a job says when Spark does not start: the cause from a Java exception's chain, and whether
a Spark Connect server's address answers at all.

Py4J reports a failed constructor as "An error occurred while calling
None.org.apache.spark.sql.classic.SparkSession."; the reason is further down the Java
exception's causes (``UnknownHostException: spark-master``). A Spark Connect client retries an
unreachable server for ten minutes and more, saying nothing; a TCP connection tried first, with a
timeout, tells "connection refused" or "unknown host" in a second.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

CONNECT_DEFAULT_PORT = 15002  # Spark Connect's, when sc://HOST has none


def java_cause(error: BaseException) -> str | None:
    """``Class: message`` of the deepest cause of a Py4J Java exception (``None`` for another
    error, or if the JVM cannot be asked any more)."""
    java = getattr(error, "java_exception", None)
    if java is None:
        return None
    try:
        seen = 0
        while java.getCause() is not None and seen < 20:
            java, seen = java.getCause(), seen + 1
        name = str(java.getClass().getSimpleName())
        message = java.getMessage()
    except Exception:  # the gateway is gone: no more to say than the error's own line
        return None
    text = " ".join(str(message).split()) if message is not None else ""
    return f"{name}: {text}" if text else name


def connect_address(remote: str) -> tuple[str, int]:
    """The host and port of a Spark Connect URL ``sc://host[:port][/;param=value...]``."""
    parts = urlsplit(remote.split(";", 1)[0])
    try:
        port = parts.port or CONNECT_DEFAULT_PORT
    except ValueError:
        port = CONNECT_DEFAULT_PORT
    return parts.hostname or "localhost", port


def shown_address(remote: str) -> str:
    """``sc://host:port``: the URL without its parameters (a ``token=`` is a secret)."""
    host, port = connect_address(remote)
    return f"sc://{host}:{port}"


def unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to ``host:port`` fails within ``timeout`` seconds, or ``None`` if it opens."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return f"unknown host {host}"
    problem = f"no connection to {host}:{port}"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(address)
                return None
        except TimeoutError:
            problem = f"no answer from {host}:{port} within {timeout:g} s"
        except OSError as e:
            problem = f"{e.strerror or type(e).__name__} at {host}:{port}".replace(
                "Connection refused", "connection refused"
            )
    return problem


def unreachable_master(master: str, timeout: float = 5.0) -> str | None:
    """Why a standalone master (``spark://host:port[,host:port...]``) cannot be reached, naming each
    address, or ``None`` if one answers or ``master`` is not a standalone one (local, yarn, k8s).

    Spark would try to register with it for a minute and more, then fail as "Cannot call methods on a
    stopped SparkContext", its cause only in a WARN line of the log.
    """
    if not master.startswith("spark://"):
        return None
    problems = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            continue
        problem = unreachable(host, int(port), timeout)
        if problem is None:
            return None
        problems.append(problem)
    return "; ".join(problems) or None

"""TLS and SCRAM logins for the test broker's SASL_SSL listener.

:func:`make_certificates` makes a CA and a certificate for 127.0.0.1 it signs (``openssl``), the
broker's key and chain as a PEM keystore; :func:`broker_settings` are the listener's
``server.properties`` lines (SCRAM-SHA-512 logins, that keystore, no client certificates);
:func:`scram_format_args` write the users' credentials when the log directory is formatted
(``kafka-storage format --add-scram``: a KRaft broker has no ZooKeeper to hold them). A missing or failing
``openssl`` is a :class:`~txstore.testing.kafka_process.KafkaStartFailed` in one line.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from txstore.testing.kafka_process import KafkaStartFailed

SCRAM_MECHANISM = "SCRAM-SHA-512"
CERTIFICATE_DAYS = 7


def _openssl(workdir: Path, *args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaStartFailed("a SASL_SSL listener needs openssl on PATH (apt-get install openssl)")
    done = subprocess.run(
        [openssl, *args], cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise KafkaStartFailed(
            f"openssl {args[0]} failed (exit {done.returncode}): {lines[-1] if lines else ''}"
        )


def make_certificates(directory: Path) -> tuple[Path, Path]:
    """A CA, and a certificate for 127.0.0.1 (and localhost) it signs, valid for a week:
    ``(the CA's PEM, the broker's PEM keystore: unencrypted PKCS#8 key, then its chain)``."""
    directory.mkdir(parents=True, exist_ok=True)
    days = str(CERTIFICATE_DAYS)
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        days,
        "-subj",
        "/CN=txstore test CA",
    )
    _openssl(
        directory,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "broker.key",
        "-out",
        "broker.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        directory,
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "broker.pem",
        "-days",
        days,
        "-extfile",
        "san.cnf",
    )
    keystore = directory / "broker-keystore.pem"
    keystore.write_text(
        (directory / "broker.key").read_text()
        + (directory / "broker.pem").read_text()
        + (directory / "ca.pem").read_text()
    )
    return directory / "ca.pem", keystore


def broker_settings(keystore: Path) -> dict[str, str]:
    """The ``server.properties`` lines of a ``SASL_SSL`` listener (the listener itself is among
    the broker's listeners): SCRAM logins, ``keystore`` (:func:`make_certificates`), no client
    certificates asked for."""
    return {
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.client.auth": "none",
    }


def scram_format_args(users: Mapping[str, str]) -> list[str]:
    """``kafka-storage format`` arguments that store each user's SCRAM credentials (name to password)."""
    return [
        arg
        for name, password in sorted(users.items())
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
    ]

"""TLS and SCRAM logins for the test broker's SASL_SSL listener.

:func:`make_certificates` makes a CA and a certificate for 127.0.0.1 it signs (``openssl``), the
broker's key and chain as a PEM keystore; :func:`make_faulty_certificates` two more keystores that
CA signs, one expired and one for another host name (:data:`FAULTY_LISTENERS`, each served on a
listener of its own: a client trusting the CA still refuses them); :func:`broker_settings` are the
listeners' ``server.properties`` lines (SCRAM-SHA-512 logins, those keystores, no client certificates);
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
EXPIRED = "EXPIRED"
OTHER_HOST = "OTHER_HOST"
FAULTY_LISTENERS = (EXPIRED, OTHER_HOST)
"""SASL_SSL listeners whose certificates, signed by the trusted CA, are refused all the same:
``EXPIRED`` is for 127.0.0.1 and was valid in January 2025 only; ``OTHER_HOST`` is valid for a week
for :data:`OTHER_HOST_NAMES` only, never the 127.0.0.1 a client connects to."""
EXPIRED_DATES = ("20250101000000Z", "20250201000000Z")
OTHER_HOST_NAMES = "DNS:kafka.other.example,IP:10.255.255.1"

# ``openssl ca`` (a start date in the past needs it on OpenSSL 3.0; ``x509 -not_before`` is 3.4+).
_CA_CONFIG = """[ ca ]
default_ca = test_ca
[ test_ca ]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
default_md = sha256
policy = any_name
unique_subject = no
[ any_name ]
commonName = supplied
[ expired ]
subjectAltName = IP:127.0.0.1,DNS:localhost
[ other_host ]
subjectAltName = {other_host}
"""


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


def make_faulty_certificates(directory: Path) -> dict[str, Path]:
    """After :func:`make_certificates` in ``directory``: a PEM keystore per listener of
    :data:`FAULTY_LISTENERS`, its certificate signed by the same CA (``openssl ca``)."""
    database = directory / "ca-db"
    database.mkdir(exist_ok=True)
    (database / "index.txt").write_text("")
    (database / "serial").write_text("1000\n")
    (directory / "ca.cnf").write_text(_CA_CONFIG.format(other_host=OTHER_HOST_NAMES))
    dates = {
        EXPIRED: ["-startdate", EXPIRED_DATES[0], "-enddate", EXPIRED_DATES[1]],
        OTHER_HOST: ["-days", str(CERTIFICATE_DAYS)],
    }
    keystores: dict[str, Path] = {}
    for name in FAULTY_LISTENERS:
        stem = name.lower()
        _openssl(
            directory,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{stem}.key",
            "-out",
            f"{stem}.csr",
            "-subj",
            "/CN=127.0.0.1" if name == EXPIRED else "/CN=kafka.other.example",
        )
        _openssl(
            directory,
            "ca",
            "-batch",
            "-config",
            "ca.cnf",
            "-cert",
            "ca.pem",
            "-keyfile",
            "ca.key",
            "-in",
            f"{stem}.csr",
            "-out",
            f"{stem}.pem",
            "-extensions",
            stem,
            "-notext",
            *dates[name],
        )
        keystore = keystores[name] = directory / f"{stem}-keystore.pem"
        keystore.write_text(
            (directory / f"{stem}.key").read_text()
            + (directory / f"{stem}.pem").read_text()
            + (directory / "ca.pem").read_text()
        )
    return keystores


def broker_settings(keystore: Path, faulty: Mapping[str, Path] | None = None) -> dict[str, str]:
    """The ``server.properties`` lines of a ``SASL_SSL`` listener (the listener itself is among
    the broker's listeners): SCRAM logins, ``keystore`` (:func:`make_certificates`), no client
    certificates asked for; and of the listeners in ``faulty`` (name to keystore,
    :func:`make_faulty_certificates`), each with its own keystore."""
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    settings = {
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.client.auth": "none",
    }
    for name, path in (faulty or {}).items():
        settings[f"listener.name.{name.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = jaas
        settings[f"listener.name.{name.lower()}.ssl.keystore.type"] = "PEM"
        settings[f"listener.name.{name.lower()}.ssl.keystore.location"] = str(path)
    return settings


def scram_format_args(users: Mapping[str, str]) -> list[str]:
    """``kafka-storage format`` arguments that store each user's SCRAM credentials (name to password)."""
    return [
        arg
        for name, password in sorted(users.items())
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
    ]

"""Why a broker's certificate was refused, when librdkafka only says "certificate verify failed".

librdkafka reports an untrusted CA, an expired certificate and one issued for another host name
in the same words, which point at ``ssl.ca.location`` whatever the cause. When a client refuses
a broker's certificate, :func:`certificate_refusal` repeats the TLS handshake with Python's
``ssl`` module and the client's own settings (``ssl.ca.location`` or ``ssl.ca.pem``, else the
system's CAs; the host name checked unless ``ssl.endpoint.identification.algorithm=none``), which
names OpenSSL's reason, and reads the certificate itself (a second handshake that does not
verify) for its end date and the names it holds. Every connection is bounded by a timeout; if
neither handshake tells, the line lists the possible causes.
"""

from __future__ import annotations

import _ssl
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from txstore.core.errors import KafkaUnavailable

CHECK_TIMEOUT_SECONDS = 5.0
"""How long the checks of every bootstrap server may take together."""

# OpenSSL's X509_V_ERR_* codes (x509_vfy.h) that mean "no trusted CA signed this chain".
_UNTRUSTED = frozenset({2, 7, 18, 19, 20, 21, 27})
_NOT_YET_VALID = 9
_EXPIRED = 10
_NAME_MISMATCH = frozenset({62, 64})  # a host name, an IP address the certificate does not hold


@dataclass(frozen=True)
class _Refused:
    """What Python's own handshake with one broker found."""

    host: str
    code: int
    reason: str  # OpenSSL's, e.g. "certificate has expired"
    certificate: Mapping[str, Any]  # the broker's own certificate, decoded ({} if unreadable)


def certificate_refusal(servers: str, conf: Mapping[str, Any], reason: str) -> KafkaUnavailable:
    """The one line for a broker certificate the client refused, ``reason`` being librdkafka's
    words: what was wrong with it (expired, not yet valid, issued for other names, or signed by
    a CA the client does not trust) and what to do, as far as a handshake of our own tells."""
    found = _check(servers, conf)
    if found is None or found.code in _UNTRUSTED:
        return KafkaUnavailable(
            f"Kafka at {servers} sent a certificate this client does not trust ({reason}); check "
            "--kafka-option ssl.ca.location (the CA that signed the broker's certificate)"
            + (
                ""
                if found is not None
                else ", the certificate's dates, and that it names the host connected to"
            )
        )
    why = f"certificate verify failed: {found.reason}"
    if found.code == _EXPIRED:
        return KafkaUnavailable(
            f"Kafka at {servers} sent a certificate {_expired(found.certificate)} ({why}); have the broker's "
            "certificate renewed (the CA in --kafka-option ssl.ca.location is trusted)"
        )
    if found.code == _NOT_YET_VALID:
        return KafkaUnavailable(
            f"Kafka at {servers} sent a certificate {_not_yet_valid(found.certificate)} ({why}); check this "
            "machine's clock and the certificate's start date"
        )
    if found.code in _NAME_MISMATCH:
        return KafkaUnavailable(
            f"Kafka at {servers} sent a certificate for {_names(found.certificate)} but was reached as "
            f"{found.host} ({why}); connect by a name the certificate holds (--bootstrap-servers and the "
            f"broker's advertised.listeners), or have the broker's certificate issued for {found.host}"
        )
    return KafkaUnavailable(
        f"Kafka at {servers} sent a certificate this client does not trust ({why}); check --kafka-option "
        "ssl.ca.location (the CA that signed the broker's certificate), the certificate's dates, and that it "
        "names the host connected to"
    )


def _check(servers: str, conf: Mapping[str, Any]) -> _Refused | None:
    """The first bootstrap server whose certificate Python's handshake refuses too, within
    :data:`CHECK_TIMEOUT_SECONDS` for all of them; None if none does (or none answers)."""
    deadline = time.monotonic() + CHECK_TIMEOUT_SECONDS
    try:
        context = _verifying_context(conf)
    except (OSError, ValueError, ssl.SSLError):
        return None  # the CA settings themselves are unreadable: librdkafka's words stand
    for server in servers.split(",")[:10]:
        host, port = _address(server)
        left = deadline - time.monotonic()
        if port is None or left <= 0:
            continue
        try:
            with socket.create_connection((host, port), timeout=left) as raw:
                raw.settimeout(max(deadline - time.monotonic(), 0.01))
                with context.wrap_socket(raw, server_hostname=host):
                    pass
        except ssl.SSLCertVerificationError as e:
            certificate = _peer_certificate(host, port, deadline)
            return _Refused(host, int(e.verify_code), str(e.verify_message), certificate)
        except (OSError, ValueError):
            continue
    return None


def _verifying_context(conf: Mapping[str, Any]) -> ssl.SSLContext:
    """A client context verifying as librdkafka does with ``conf``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    identification = str(conf.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    context.check_hostname = identification == "https"
    location = str(conf.get("ssl.ca.location", "")).strip()
    if conf.get("ssl.ca.pem"):
        context.load_verify_locations(cadata=str(conf["ssl.ca.pem"]))
    elif location and location != "probe":
        if os.path.isdir(location):
            context.load_verify_locations(capath=location)
        else:
            context.load_verify_locations(cafile=location)
    else:
        context.load_default_certs()
    return context


def _address(server: str) -> tuple[str, int | None]:
    """``host`` and port of a bootstrap server (``sasl_ssl://h:9093``, ``[::1]:9093``)."""
    address = server.strip().split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return address, None


def _peer_certificate(host: str, port: int, deadline: float) -> Mapping[str, Any]:
    """The broker's certificate, decoded, from a handshake that does not verify it ({} if that
    fails, or this Python cannot decode certificates)."""
    decode = getattr(_ssl, "_test_decode_cert", None)  # CPython's decoder (no extra package)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.01)) as raw:
            raw.settimeout(max(deadline - time.monotonic(), 0.01))
            with context.wrap_socket(raw, server_hostname=host) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return {}
    if der is None or decode is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="txstore-certificate-") as directory:
        path = os.path.join(directory, "broker.pem")
        with open(path, "w") as f:
            f.write(ssl.DER_cert_to_PEM_cert(der))
        try:
            decoded = decode(path)
        except (OSError, ValueError, ssl.SSLError):
            return {}
    return decoded if isinstance(decoded, dict) else {}


def _seconds(certificate: Mapping[str, Any], field: str) -> float | None:
    """A certificate date (``notAfter``, ``notBefore``) in seconds since the epoch."""
    value = certificate.get(field)
    try:
        return float(ssl.cert_time_to_seconds(value)) if isinstance(value, str) else None
    except ValueError:
        return None


def _when(certificate: Mapping[str, Any], field: str) -> str | None:
    """A certificate date as ``2025-02-01 00:00:00 UTC``."""
    seconds = _seconds(certificate, field)
    return (
        None
        if seconds is None
        else datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    )


def _expired(certificate: Mapping[str, Any]) -> str:
    end, seconds = _when(certificate, "notAfter"), _seconds(certificate, "notAfter")
    if end is None or seconds is None:
        return "that has expired"
    if seconds > time.time():  # its own is valid: a CA in its chain expired
        return f"whose chain holds an expired certificate (its own is valid until {end})"
    return f"that expired on {end}"


def _not_yet_valid(certificate: Mapping[str, Any]) -> str:
    start = _when(certificate, "notBefore")
    return f"not valid before {start}" if start else "not valid yet"


def _names(certificate: Mapping[str, Any]) -> str:
    """The host names and addresses a certificate holds (else its common name)."""
    names = [str(value) for _, value in certificate.get("subjectAltName", ())]
    if not names:
        names = [str(v) for rdn in certificate.get("subject", ()) for k, v in rdn if k == "commonName"]
    return ", ".join(names) if names else "other names"

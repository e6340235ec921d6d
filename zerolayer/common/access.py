"""The files of :class:`AccessSettings`, read and checked once at start-up (by the frontend, and
before any process starts by ``zerolayer up``'s pre-flight check), each failure a
:class:`SettingError` naming its flag.

TLS and mTLS of the public port come from the PEM files of ``--tls-cert``, ``--tls-key`` and
``--tls-client-ca`` and go to gRPC's own ``grpc.ssl_server_credentials``; the internal layers talk
over unix sockets in a 0700 run directory and stay plaintext.

The ``--tenants`` file is JSON: an object of tenant name -> list of the lower-case hex SHA-256
digests of that tenant's bearer tokens (``printf %s "$TOKEN" | sha256sum``), so the file holds no
token itself; e.g. ``{"tenant-a": ["9f86d081..."], "tenant-b": []}``. What the frontend does with
it: ``zerolayer.frontend.tenants``.
"""

from __future__ import annotations

import json
import re
import ssl
from dataclasses import dataclass
from typing import Any

import grpc

from zerolayer.common.config import AccessSettings
from zerolayer.common.setting import Setting, SettingError
from zerolayer.common.settings import TENANTS, TLS_CERT, TLS_CLIENT_CA, TLS_KEY

MAX_TENANT_NAME_BYTES = 128
"""Longest tenant name in the ``--tenants`` file, bytes."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ServerTls:
    """The public port's TLS material, checked: the key matches the first certificate."""

    cert_chain: bytes
    """PEM certificate chain, the server's certificate first."""
    private_key: bytes
    """PEM private key of the chain's first certificate."""
    client_ca: bytes | None
    """PEM CA certificates a client certificate must chain to; None: no client certificate is
    asked for (TLS, not mTLS)."""

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials: TLS, and with :attr:`client_ca` a required, verified client
        certificate (a client without one, or with one of another CA, fails the handshake)."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def read_server_tls(access: AccessSettings) -> ServerTls | None:
    """Reads and checks the TLS files of ``access``; None when no TLS flag is given.

    Raises:
        SettingError: a flag without the one it needs (``--tls-key``/``--tls-client-ca``
            without ``--tls-cert``, ``--tls-cert`` without ``--tls-key``), a file that cannot
            be read, that holds no PEM certificate (or key), or a key that does not match the
            certificate (Python's ``ssl`` module, i.e. OpenSSL, parses them).
    """
    if not (access.tls_cert or access.tls_key or access.tls_client_ca):
        return None
    if not access.tls_cert:
        given = TLS_KEY if access.tls_key else TLS_CLIENT_CA
        raise SettingError(given, f"needs {TLS_CERT.flag} and {TLS_KEY.flag}")
    if not access.tls_key:
        raise SettingError(TLS_CERT, f"needs {TLS_KEY.flag}")
    cert_chain = _read(TLS_CERT, access.tls_cert)
    _check_certificates(TLS_CERT, cert_chain)
    private_key = _read(TLS_KEY, access.tls_key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # NOTE: the password callback stops OpenSSL from prompting on a terminal for an
        # encrypted key; gRPC could not decrypt one either.
        context.load_cert_chain(access.tls_cert, access.tls_key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise SettingError(
            TLS_KEY, f"not an unencrypted PEM private key of {TLS_CERT.flag} ({_why(exc)})"
        ) from None
    client_ca = None
    if access.tls_client_ca:
        client_ca = _read(TLS_CLIENT_CA, access.tls_client_ca)
        _check_certificates(TLS_CLIENT_CA, client_ca)
    return ServerTls(cert_chain, private_key, client_ca)


def _read(setting: Setting, path: str) -> bytes:
    """The bytes of the file ``path`` of ``setting``; SettingError when it cannot be read."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise SettingError(setting, f"cannot read {path}: {exc.strerror}") from None


def _check_certificates(setting: Setting, pem: bytes) -> None:
    """Raises SettingError unless ``pem`` holds PEM certificates OpenSSL parses (and nothing
    else it would choke on)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise SettingError(setting, f"not PEM certificates ({_why(exc)})") from None


def _why(exc: Exception) -> str:
    """An ssl error's short reason (OpenSSL's reason code), else the exception's text."""
    return getattr(exc, "reason", None) or str(exc)


def plaintext_tokens_warning(tenants: str, tls_cert: str) -> str | None:
    """The start-up WARNING of a public port that takes bearer tokens (a ``--tenants`` file) in
    plaintext (no ``--tls-cert``): anyone on the path can read and replay them. None otherwise."""
    if not tenants or tls_cert:
        return None
    return (
        f"{TENANTS.flag} without {TLS_CERT.flag}: bearer tokens travel in plaintext, readable "
        "(and replayable) by anyone on the network path; give --tls-cert and --tls-key"
    )


def read_tenants(path: str) -> dict[bytes, str]:
    """The ``--tenants`` file: token digest -> tenant (format: the module docstring).

    Raises:
        SettingError: the file cannot be read, is not that JSON, names a tenant "" or longer
            than :data:`MAX_TENANT_NAME_BYTES`, holds a digest that is not 64 lower-case hex
            digits, or lists one digest twice.
    """
    try:
        with open(path, "rb") as file:
            document: Any = json.load(file)
    except OSError as exc:
        raise SettingError(TENANTS, f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SettingError(TENANTS, f"{path}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise SettingError(TENANTS, f"{path}: not an object of tenant -> token digests")
    tenants: dict[bytes, str] = {}
    for tenant, digests in document.items():
        if not tenant or len(tenant.encode()) > MAX_TENANT_NAME_BYTES:
            raise SettingError(TENANTS, f"{path}: tenant {tenant!r}: 1..128 bytes")
        if not isinstance(digests, list):
            raise SettingError(TENANTS, f"{path}: tenant {tenant!r}: not a list of digests")
        for digest in digests:
            if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
                raise SettingError(
                    TENANTS, f"{path}: tenant {tenant!r}: not a lower-case hex SHA-256 digest"
                )
            if bytes.fromhex(digest) in tenants:
                raise SettingError(TENANTS, f"{path}: tenant {tenant!r}: a digest listed twice")
            tenants[bytes.fromhex(digest)] = tenant
    return tenants

"""TLS and mTLS of the public port, from the PEM files of ``--tls-cert``, ``--tls-key`` and
``--tls-client-ca``: read and checked once at start-up (by the frontend, and before any process
starts by ``zerolayer up``'s pre-flight check), then handed to gRPC's own
``grpc.ssl_server_credentials``. The internal layers talk over unix sockets in a 0700 run
directory and stay plaintext.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import grpc

from zerolayer.common.config import AccessSettings
from zerolayer.common.setting import Setting, SettingError
from zerolayer.common.settings import TLS_CERT, TLS_CLIENT_CA, TLS_KEY


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

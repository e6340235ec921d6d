"""Test certificates made with the ``openssl`` command: a CA, a server certificate for
localhost and 127.0.0.1, client certificates of that CA for tenant-a and tenant-b, and a client
certificate (CN=tenant-a) of another CA, which a server trusting the first must refuse."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class CertSet:
    ca: Path
    """The CA certificate that signed ``server``, ``tenant_a`` and ``tenant_b``."""
    server: Pair
    tenant_a: Pair
    tenant_b: Pair
    other_ca: Path
    """Another CA, which signed ``stranger``."""
    stranger: Pair
    """CN=tenant-a, but of ``other_ca``."""
    two_names: Pair
    """Of ``ca``, with two common names: subject ``/CN=tenant-b/CN=tenant-a``."""


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> Pair:
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    _openssl(
        "req", "-x509", *EC_KEY, "-keyout", pair.key, "-out", pair.cert, "-days", "2",
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def _make_leaf(directory: Path, ca: Pair, name: str, extensions: str, subject: str = "") -> Pair:
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", *EC_KEY, "-keyout", pair.key, "-out", csr, "-subj", subject or f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
        "-out", pair.cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return pair


def make_test_certs(directory: Path) -> CertSet:
    """Writes the certificates and keys into ``directory`` (about 0.1 s)."""
    ca, other_ca = _make_ca(directory, "zl-test-ca"), _make_ca(directory, "zl-other-ca")
    client = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    server = (
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
    )
    stranger_dir = directory / "other"
    stranger_dir.mkdir()
    return CertSet(
        ca=ca.cert,
        server=_make_leaf(directory, ca, "localhost", server),
        tenant_a=_make_leaf(directory, ca, "tenant-a", client),
        tenant_b=_make_leaf(directory, ca, "tenant-b", client),
        other_ca=other_ca.cert,
        stranger=_make_leaf(stranger_dir, other_ca, "tenant-a", client),
        two_names=_make_leaf(directory, ca, "two-names", client, "/CN=tenant-b/CN=tenant-a"),
    )

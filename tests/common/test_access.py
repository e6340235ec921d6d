"""The access files: the TLS PEM files and the ``--tenants`` file, checked at start-up (one line
naming the flag); and a real TLS server (LayerServer with the checked credentials) that a TLS
client with the right CA reaches while a plaintext client or one trusting another CA is refused,
its private address serving health alone, in plaintext. mTLS, tenants and the whole stack:
tests/e2e/test_public_access.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from pathlib import Path

import grpc
import pytest
from common.test_server_health import SERVICE, SERVING, make_server, statuses
from e2e.stack import free_port
from tls_certs import CertSet, make_test_certs

from zerolayer.common.access import plaintext_tokens_warning, read_server_tls, read_tenants
from zerolayer.common.config import AccessSettings
from zerolayer.common.setting import SettingError
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def access(certs: CertSet, **changes: str) -> AccessSettings:
    files = {"tls_cert": str(certs.server.cert), "tls_key": str(certs.server.key)}
    return AccessSettings(**(files | changes))


def test_no_tls_flag_is_plaintext() -> None:
    assert read_server_tls(AccessSettings()) is None


def test_tls_and_mtls_files_are_read(certs: CertSet) -> None:
    tls = read_server_tls(access(certs))
    assert tls.cert_chain == certs.server.cert.read_bytes()
    assert tls.private_key == certs.server.key.read_bytes()
    assert tls.client_ca is None
    assert read_server_tls(access(certs, tls_client_ca=str(certs.ca))).client_ca == (
        certs.ca.read_bytes()
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tls_cert": ""}, "--tls-key: needs --tls-cert and --tls-key"),
        ({"tls_cert": "", "tls_key": "", "tls_client_ca": "CA"}, "--tls-client-ca: needs"),
        ({"tls_key": ""}, "--tls-cert: needs --tls-key"),
        ({"tls_cert": "/nonexistent.pem"}, "--tls-cert: cannot read /nonexistent.pem: No such"),
        ({"tls_cert": "KEY"}, "--tls-cert: not PEM certificates"),
        ({"tls_key": "/nonexistent.key"}, "--tls-key: cannot read /nonexistent.key: No such"),
        ({"tls_key": "OTHER_KEY"}, "--tls-key: not an unencrypted PEM private key of --tls-cert"),
        ({"tls_key": "CERT"}, "--tls-key: not an unencrypted PEM private key of --tls-cert"),
        ({"tls_client_ca": "/nonexistent"}, "--tls-client-ca: cannot read /nonexistent: No"),
        ({"tls_client_ca": "KEY"}, "--tls-client-ca: not PEM certificates"),
    ],
)
def test_unusable_tls_files_are_refused_naming_the_flag(
    certs: CertSet, changes: dict[str, str], message: str
) -> None:
    names = {
        "KEY": str(certs.server.key),
        "OTHER_KEY": str(certs.tenant_a.key),
        "CERT": str(certs.server.cert),
    }
    with pytest.raises(SettingError) as raised:
        read_server_tls(access(certs, **{k: names.get(v, v) for k, v in changes.items()}))
    assert str(raised.value).startswith(message)


def tokenize(channel: grpc.aio.Channel) -> list[int] | str:
    """Tokenize's token ids, or the failed call's status name."""

    async def call() -> list[int] | str:
        try:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            response = await stub.Tokenize(pb.TokenizeRequest(text="abc"), timeout=5)
            return list(response.token_ids)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name

    return call()


def tls_channel(address: str, ca: Path) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(
        address, grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    )


def test_a_tls_port_serves_tls_clients_only_and_its_private_address_health_alone(
    certs: CertSet, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{free_port()}"
    instance = f"zl-tls-{uuid.uuid4().hex[:8]}"
    credentials = read_server_tls(access(certs)).credentials()
    private = f"unix:{tmp_path / 'frontend.sock'}"

    async def run() -> dict[str, object]:
        server = make_server(
            address, instance_id=instance, credentials=credentials, private_address=private
        )
        await server.start()
        await server.set_serving(True)
        try:
            found: dict[str, object] = {}
            async with tls_channel(address, certs.ca) as channel:
                found["tls"] = await tokenize(channel)
            async with tls_channel(f"localhost:{address.rpartition(':')[2]}", certs.ca) as ch:
                found["tls by name"] = await tokenize(ch)
            async with grpc.aio.insecure_channel(address) as channel:
                found["plaintext"] = await tokenize(channel)
            async with tls_channel(address, certs.other_ca) as channel:
                found["other CA"] = await tokenize(channel)
            found["private health"] = await statuses(private, SERVICE)
            async with grpc.aio.insecure_channel(private) as channel:
                found["private tokenize"] = await tokenize(channel)
            return found
        finally:
            await server.stop(0)

    assert asyncio.run(run()) == {
        "tls": [3],
        "tls by name": [3],
        "plaintext": "UNAVAILABLE",
        "other CA": "UNAVAILABLE",
        "private health": [SERVING],
        "private tokenize": "UNIMPLEMENTED",
    }


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenants_file(tmp_path: Path, document: object) -> str:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_the_file_maps_each_tokens_digest_to_its_tenant(tmp_path: Path) -> None:
    document = {"tenant-a": [sha256_hex("a1"), sha256_hex("a2")], "tenant-b": [], "c": []}
    assert read_tenants(tenants_file(tmp_path, document)) == {
        hashlib.sha256(b"a1").digest(): "tenant-a",
        hashlib.sha256(b"a2").digest(): "tenant-a",
    }


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ([], "not an object of tenant -> token digests"),
        ({"": []}, "tenant '': 1..128 bytes"),
        ({"t" * 129: []}, f"tenant {'t' * 129!r}: 1..128 bytes"),
        ({"a": "abc"}, "tenant 'a': not a list of digests"),
        ({"a": ["token-a"]}, "tenant 'a': not a lower-case hex SHA-256 digest"),
        ({"a": [sha256_hex("x").upper()]}, "tenant 'a': not a lower-case hex SHA-256 digest"),
        ({"a": [sha256_hex("x")], "b": [sha256_hex("x")]}, "tenant 'b': a digest listed twice"),
    ],
)
def test_a_bad_tenants_file_is_refused_naming_the_flag(
    tmp_path: Path, document: object, reason: str
) -> None:
    path = tenants_file(tmp_path, document)
    with pytest.raises(SettingError) as raised:
        read_tenants(path)
    assert str(raised.value) == f"--tenants: {path}: {reason}"


def test_an_unreadable_or_non_json_tenants_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="^--tenants: cannot read /nonexistent: No such file"):
        read_tenants("/nonexistent")
    (tmp_path / "t.json").write_text("{")
    with pytest.raises(SettingError, match="^--tenants: .*t.json: not JSON"):
        read_tenants(str(tmp_path / "t.json"))


def test_tenants_without_tls_is_warned_of() -> None:
    warning = plaintext_tokens_warning("t.json", "")
    assert warning is not None and warning.startswith("--tenants without --tls-cert: bearer")
    assert plaintext_tokens_warning("t.json", "c.pem") is None
    assert plaintext_tokens_warning("", "") is None

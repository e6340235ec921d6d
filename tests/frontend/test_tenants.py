"""The server-side tenant of a public call: the ``--tenants`` file, bearer tokens, mTLS common
names, and the prefix-cache namespace they make. Against a real stack:
tests/e2e/test_public_access.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from zerolayer.common.errors import Unauthenticated
from zerolayer.common.setting import SettingError
from zerolayer.frontend.tenants import TenantPolicy, read_tenants, scoped_cache_salt


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenants_file(tmp_path: Path, document: object) -> str:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(document))
    return str(path)


def make_policy(client_certificates: bool = False) -> TenantPolicy:
    digests = {hashlib.sha256(b"token-a").digest(): "tenant-a"}
    digests[hashlib.sha256(b"token-b").digest()] = "tenant-b"
    return TenantPolicy(digests, client_certificates)


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


def test_without_tenants_nobody_is_identified_and_the_salt_is_used_as_sent() -> None:
    policy = TenantPolicy()
    assert not policy.enabled
    assert policy.tenant("Bearer anything", "tenant-a") == ""
    assert scoped_cache_salt("", "client salt") == "client salt"


def test_a_bearer_token_names_its_tenant() -> None:
    policy = make_policy()
    assert policy.tenant("Bearer token-a", None) == "tenant-a"
    assert policy.tenant("bearer  token-b ", None) == "tenant-b"


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "no tenant: this server needs 'authorization: Bearer <token>' metadata"),
        ("Bearer token-c", "authorization: unknown bearer token"),
        ("Basic token-a", "authorization: not 'Bearer <token>'"),
        ("Bearer ", "authorization: not 'Bearer <token>'"),
    ],
)
def test_no_or_an_unknown_token_is_unauthenticated_without_quoting_it(
    authorization: str | None, message: str
) -> None:
    with pytest.raises(Unauthenticated) as raised:
        make_policy().tenant(authorization, "tenant-a")  # no mTLS: the name is not taken
    assert str(raised.value) == message


def test_with_mtls_the_certificates_common_name_is_the_tenant_unless_a_token_says() -> None:
    policy = make_policy(client_certificates=True)
    assert policy.tenant(None, "tenant-c") == "tenant-c"
    assert policy.tenant("Bearer token-b", "tenant-a") == "tenant-b"
    with pytest.raises(Unauthenticated, match="^authorization: unknown bearer token$"):
        policy.tenant("Bearer token-c", "tenant-a")
    certificates_only = TenantPolicy(client_certificates=True)
    assert certificates_only.tenant("Bearer ignored", "tenant-a") == "tenant-a"
    with pytest.raises(Unauthenticated) as raised:
        certificates_only.tenant(None, None)
    assert str(raised.value) == (
        "no tenant: this server needs a client certificate with a common name"
    )


def test_a_tenants_namespace_is_its_own_and_a_client_salt_only_narrows_it() -> None:
    assert scoped_cache_salt("tenant-a", "") == "tenant:8:tenant-a"
    assert scoped_cache_salt("tenant-a", "s") == "tenant:8:tenant-as"
    # NOTE: no client salt names another tenant's namespace, nor a tenant-less caller's
    assert scoped_cache_salt("tenant-b", "tenant:8:tenant-a") != scoped_cache_salt("tenant-a", "")
    assert scoped_cache_salt("a", "bc") != scoped_cache_salt("ab", "c")

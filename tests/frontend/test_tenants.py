"""The server-side tenant of a public call: bearer tokens, mTLS common names, and the
prefix-cache namespace they make (the ``--tenants`` file: tests/common/test_access.py). Against a
real stack: tests/e2e/test_public_access.py."""

from __future__ import annotations

import hashlib

import pytest

from zerolayer.common.errors import Unauthenticated
from zerolayer.frontend.tenants import (
    TenantPolicy,
    call_tenant,
    count_common_names,
    scoped_cache_salt,
)


def make_policy(client_certificates: bool = False) -> TenantPolicy:
    digests = {hashlib.sha256(b"token-a").digest(): "tenant-a"}
    digests[hashlib.sha256(b"token-b").digest()] = "tenant-b"
    return TenantPolicy(digests, client_certificates)


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


class CallContext:
    """What call_tenant reads of a grpc.aio.ServicerContext."""

    def __init__(self, metadata: tuple[tuple[str, str], ...], subject: str = "") -> None:
        self.metadata = metadata
        self.subject = subject

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        if not self.subject:
            return {}
        # NOTE: gRPC names one common name even when the subject has several
        first = self.subject.replace("+", ",").split(",")[-1].removeprefix("CN=")
        return {"x509_subject": [self.subject.encode()], "x509_common_name": [first.encode()]}


def test_ambiguous_identities_are_unauthenticated() -> None:
    policy = make_policy(client_certificates=True)
    twice = (("authorization", "Bearer token-a"), ("authorization", "Bearer token-b"))
    with pytest.raises(Unauthenticated) as raised:
        call_tenant(policy, CallContext(twice))
    assert str(raised.value) == "authorization: sent more than once (one token a call)"
    with pytest.raises(Unauthenticated) as raised:
        call_tenant(policy, CallContext((), "CN=tenant-a,CN=tenant-b"))
    assert str(raised.value) == "client certificate: its subject has more than one common name"
    assert call_tenant(policy, CallContext(twice[:1], "CN=tenant-a")) == "tenant-a"
    assert call_tenant(policy, CallContext((), "O=x+CN=tenant-c")) == "tenant-c"
    # without mTLS a certificate names nobody; without a --tenants file tokens are not read
    assert call_tenant(make_policy(), CallContext(twice[:1], "CN=a,CN=b")) == "tenant-a"
    assert call_tenant(TenantPolicy(client_certificates=True), CallContext(twice, "CN=a")) == "a"


@pytest.mark.parametrize(
    ("subject", "count"),
    [
        ("CN=a", 1),
        ("CN=a,CN=b", 2),
        ("cn = a+CN=b", 2),
        ("2.5.4.3=#0c0161,CN=b", 2),
        ("CN=a\\,CN=b", 1),  # an escaped comma is in the value
        ("CN=a\\\\,CN=b", 2),  # an escaped backslash ends it
        ("O=CN=x", 0),
        ("", 0),
    ],
)
def test_common_names_of_a_subject_are_counted(subject: str, count: int) -> None:
    assert count_common_names(subject) == count

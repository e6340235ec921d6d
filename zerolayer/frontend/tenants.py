"""Who a public caller is, said by the server rather than the caller: the tenant of a bearer token
listed in the ``--tenants`` file, or the subject common name of an mTLS client certificate
(``--tls-client-ca``). With either configured, every Generate-like call and Tokenize (it costs
CPU time) must have a tenant (UNAUTHENTICATED otherwise), and its prefix-cache namespace is the
tenant's: the client's ``cache_salt`` only narrows it further (:func:`scoped_cache_salt`), so no
salt reaches another tenant's cached blocks. Without either, callers are not identified and
``cache_salt`` is used as sent.

The ``--tenants`` file is read by ``zerolayer.common.access.read_tenants``. Bearer tokens: RFC
6750, sent as gRPC metadata ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zerolayer.common.errors import Unauthenticated


@dataclass(frozen=True)
class TenantPolicy:
    """How the frontend names a caller's tenant; the default identifies nobody."""

    token_tenants: Mapping[bytes, str] | None = None
    """SHA-256 digest of a bearer token -> its tenant (the ``--tenants`` file); None: no file."""
    client_certificates: bool = False
    """mTLS: a verified client certificate's subject common name is its tenant."""
    _digests: tuple[tuple[bytes, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_digests", tuple((self.token_tenants or {}).items()))

    @property
    def enabled(self) -> bool:
        """Callers are identified (and must be)."""
        return self.token_tenants is not None or self.client_certificates

    def tenant(self, authorization: str | None, common_name: str | None) -> str:
        """The caller's tenant; "" when :attr:`enabled` is off (nobody is identified).

        Args:
            authorization: the call's ``authorization`` metadata; None: absent. Read only with
                a ``--tenants`` file; a token, when sent, decides the tenant.
            common_name: the verified client certificate's subject CN; None: no certificate.

        Raises:
            Unauthenticated: identification is on and the caller has no tenant: no or an
                unknown token and no certificate (the message never quotes the token).
        """
        if not self.enabled:
            return ""
        if authorization is not None and self.token_tenants is not None:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("authorization: not 'Bearer <token>'")
            tenant = self._by_token(token.strip())
            if tenant is None:
                raise Unauthenticated("authorization: unknown bearer token")
            return tenant
        if self.client_certificates and common_name:
            return common_name
        wanted = "'authorization: Bearer <token>' metadata" if self.token_tenants else ""
        if self.client_certificates:
            wanted = " or ".join(filter(None, [wanted, "a client certificate with a common name"]))
        raise Unauthenticated(f"no tenant: this server needs {wanted}")

    def _by_token(self, token: str) -> str | None:
        """The tenant of ``token``: its digest is compared with every listed one in constant
        time (``hmac.compare_digest``), so timing tells nothing of the digests."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for listed, tenant in self._digests:
            if hmac.compare_digest(digest, listed):
                found = tenant
        return found


def scoped_cache_salt(tenant: str, cache_salt: str) -> str:
    """The prefix-cache namespace of a call: ``cache_salt`` itself without a tenant, else
    ``tenant:<length>:<tenant><cache_salt>``: the tenant's namespace, narrowed by the client's
    salt; the tenant's length in characters says where its name ends, so no tenant and salt
    make another pair's namespace."""
    return f"{TENANT_NAMESPACE}{len(tenant)}:{tenant}{cache_salt}" if tenant else cache_salt


TENANT_NAMESPACE = "tenant:"
"""How every tenant's namespace (:func:`scoped_cache_salt`) starts."""


def namespace_tenant(cache_salt: str) -> str | None:
    """The tenant whose namespace ``cache_salt`` is (:func:`scoped_cache_salt`'s inverse);
    None: no tenant's (a salt sent as is, without identified callers)."""
    if not cache_salt.startswith(TENANT_NAMESPACE):
        return None
    length, colon, rest = cache_salt[len(TENANT_NAMESPACE) :].partition(":")
    if not colon or not length.isdigit() or int(length) > len(rest):
        return None
    return rest[: int(length)]


def call_tenant(policy: TenantPolicy, context: Any) -> str:
    """The tenant of a call from its gRPC ``grpc.aio.ServicerContext``: its ``authorization``
    metadata and the ``x509_common_name`` of its verified client certificate (see
    :meth:`TenantPolicy.tenant`).

    Raises:
        Unauthenticated: see :meth:`TenantPolicy.tenant`; or the identity is ambiguous:
            ``authorization`` metadata sent more than once (with a ``--tenants`` file), or a
            client certificate whose subject has more than one common name (with mTLS).
    """
    if not policy.enabled:
        return ""
    metadata = context.invocation_metadata() or ()
    authorizations = [value for key, value in metadata if key == "authorization"]
    if len(authorizations) > 1 and policy.token_tenants is not None:
        raise Unauthenticated("authorization: sent more than once (one token a call)")
    auth = context.auth_context()
    names = auth.get("x509_common_name") or [b""]
    if policy.client_certificates and names[0]:
        subjects = auth.get("x509_subject") or [b""]
        if len(names) > 1 or count_common_names(subjects[0].decode(errors="replace")) > 1:
            raise Unauthenticated("client certificate: its subject has more than one common name")
    authorization = authorizations[0] if authorizations else None
    return policy.tenant(authorization, names[0].decode(errors="replace") or None)


def count_common_names(subject: str) -> int:
    """The CN attributes of a distinguished name in the RFC 4514 string form gRPC gives as a
    certificate's ``x509_subject`` (e.g. ``CN=tenant-a,O=x``): attributes are separated by ``,``
    or ``+`` that no backslash escapes."""
    count, escaped, at_start = 0, False, True
    attribute = ""
    for char in subject:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",+":
            at_start, attribute = True, ""
            continue
        if at_start:
            attribute += char
            if "=" in attribute:
                count += attribute[:-1].strip().upper() in ("CN", "2.5.4.3")
                at_start = False
    return count

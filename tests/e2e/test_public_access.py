"""The public port of a real stack started with mTLS (``--tls-cert``, ``--tls-key``,
``--tls-client-ca``) and ``--tenants``: clients with a certificate of the CA are served, clients
without one, with one of another CA, or in plaintext are refused; the launcher still sees its
frontend healthy (over the frontend's private health address). Each tenant (a certificate's
common name, or a bearer token's tenant) has its own prefix cache, whatever ``cache_salt`` it
sends. Plaintext mode: tests/e2e/test_generate.py; TLS without client certificates:
tests/common/test_access.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import grpc
import pytest
from e2e.stack import running_stack
from factories import make_infer_request
from tls_certs import CertSet, Pair, make_test_certs

from zerolayer.cli.main import main as zerolayer_main
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as kserve_grpc
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


TOKENS = {"token-of-a": "tenant-a", "token-of-c": "tenant-c"}
"""Bearer token -> tenant, as the stack's --tenants file lists them (by digest)."""


@pytest.fixture(scope="module")
def stack(certs: CertSet, dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.json"
    digests: dict[str, list[str]] = {}
    for token, tenant in TOKENS.items():
        digests.setdefault(tenant, []).append(hashlib.sha256(token.encode()).hexdigest())
    tenants.write_text(json.dumps(digests))
    with running_stack(
        dummy_model_dir,
        tmp_path_factory.mktemp("logs"),
        tls_cert=str(certs.server.cert),
        tls_key=str(certs.server.key),
        tls_client_ca=str(certs.ca),
        tenants=str(tenants),
    ) as stack:
        yield stack


def channel(stack, certs: CertSet, client: Pair | None, ca: Path | None = None) -> grpc.Channel:
    """A TLS channel to the stack's public port trusting ``ca`` (default: the stack's), with
    ``client``'s certificate (None: none)."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(ca or certs.ca).read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    return grpc.secure_channel(stack.config.listen, credentials)


def generate(chan: grpc.Channel, ids: list[int], salt: str = "", **call: object) -> object:
    """One greedy Generate of ``ids``: the response, or the failed call's status code."""
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=ids), max_new_tokens=2, ignore_eos=True, cache_salt=salt
    )
    try:
        return generation_pb2_grpc.TextGenerationStub(chan).Generate(request, timeout=30, **call)
    except grpc.RpcError as exc:
        return exc.code()


def test_a_client_certificate_of_the_ca_is_served(stack, certs: CertSet) -> None:
    with channel(stack, certs, certs.tenant_a) as chan:
        assert len(generate(chan, [1, 2, 3]).token_ids) == 2


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate", "plaintext"])
def test_a_client_without_a_certificate_of_the_ca_is_refused(stack, certs: CertSet, who) -> None:
    if who == "plaintext":
        chan = grpc.insecure_channel(stack.config.listen)
    elif who == "no certificate":
        chan = channel(stack, certs, None)
    else:
        chan = channel(stack, certs, certs.stranger)
    with chan:
        assert generate(chan, [1, 2, 3]) == grpc.StatusCode.UNAVAILABLE


def test_zerolayer_generate_connects_with_tls_files(stack, certs: CertSet, capsys) -> None:
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.tenant_b.cert)]
    argv = ["generate", "hi", "--address", stack.config.listen, "--max-new-tokens", "2", *tls]
    assert zerolayer_main([*argv, "--tls-key", str(certs.tenant_b.key)]) == 0
    assert zerolayer_main(argv[:6]) == 1  # plaintext
    assert "UNAVAILABLE" in capsys.readouterr().err


def bearer(token: str) -> dict[str, object]:
    return {"metadata": (("authorization", f"Bearer {token}"),)}


def cached(chan: grpc.Channel, ids: list[int], salt: str, **call: object) -> int:
    """The prompt tokens a Generate of ``ids`` under ``salt`` found cached."""
    return generate(chan, ids, salt, **call).usage.cached_prompt_tokens


def test_another_tenant_sending_the_same_cache_salt_finds_nothing_cached(
    stack, certs: CertSet
) -> None:
    prompt = [1, *range(100, 140)]  # 41 tokens: two full blocks of 16 cacheable
    with channel(stack, certs, certs.tenant_a) as a, channel(stack, certs, certs.tenant_b) as b:
        assert cached(a, prompt, "shared-salt") == 0
        assert cached(b, prompt, "shared-salt") == 0
        assert cached(b, prompt, "") == 0
        assert cached(a, prompt, "shared-salt") == 32
        assert cached(a, prompt, "") == 0  # the salt narrows the tenant's namespace
        assert cached(b, prompt, "shared-salt") == 32


def test_a_bearer_tokens_tenant_has_its_own_cache(stack, certs: CertSet) -> None:
    prompt = [1, *range(200, 240)]
    with channel(stack, certs, certs.tenant_b) as b:
        assert cached(b, prompt, "s") == 0
        # NOTE: the token decides: tenant-c's connection carries tenant-b's certificate
        assert cached(b, prompt, "s", **bearer("token-of-c")) == 0
        assert cached(b, prompt, "s", **bearer("token-of-c")) == 32
        # a token of tenant-a is tenant-a, as tenant-a's certificate is
        assert cached(b, prompt, "s", **bearer("token-of-a")) == 0
    with channel(stack, certs, certs.tenant_a) as a:
        assert cached(a, prompt, "s") == 32


def test_an_unknown_token_is_unauthenticated_and_not_quoted(stack, certs: CertSet) -> None:
    request = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]), max_new_tokens=1)
    with channel(stack, certs, certs.tenant_a) as chan:
        stub = generation_pb2_grpc.TextGenerationStub(chan)
        for method in (stub.Generate, stub.GenerateStream):
            with pytest.raises(grpc.RpcError) as raised:
                list(method(request, timeout=30, **bearer("secret-guess")))
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert raised.value.details() == "authorization: unknown bearer token"


def test_zerolayer_generate_sends_a_token_file(stack, certs: CertSet, tmp_path, capsys) -> None:
    (tmp_path / "token").write_text("secret-guess\n")
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.tenant_a.cert)]
    tls += ["--tls-key", str(certs.tenant_a.key), "--token-file", str(tmp_path / "token")]
    assert zerolayer_main(["generate", "hi", "--address", stack.config.listen, *tls]) == 1
    assert capsys.readouterr().err == (
        "zerolayer generate: UNAUTHENTICATED: authorization: unknown bearer token\n"
    )


def test_kserve_calls_are_in_their_tenants_namespace_too(stack, certs: CertSet) -> None:
    prompt = "KServe and Triton clients share the tenant's prefix cache."  # 3 blocks and more
    infer = make_infer_request("", prompt, max_tokens=1)
    text = pb.GenerateRequest(prompt=prompt, max_new_tokens=1)
    with channel(stack, certs, certs.tenant_a) as a, channel(stack, certs, certs.tenant_b) as b:
        kserve = kserve_grpc.GRPCInferenceServiceStub(a)
        infer.model_name = stack_model_name(a)
        kserve.ModelInfer(infer, timeout=30)
        with pytest.raises(grpc.RpcError) as raised:
            kserve.ModelInfer(infer, timeout=30, **bearer("secret-guess"))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        tenant_b = generation_pb2_grpc.TextGenerationStub(b).Generate(text, timeout=30)
        tenant_a = generation_pb2_grpc.TextGenerationStub(a).Generate(text, timeout=30)
    assert tenant_b.usage.cached_prompt_tokens == 0
    assert tenant_a.usage.cached_prompt_tokens >= 48


def stack_model_name(chan: grpc.Channel) -> str:
    stub = generation_pb2_grpc.TextGenerationStub(chan)
    return stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).model


def test_a_request_id_in_flight_is_its_tenants_alone(stack, certs: CertSet) -> None:
    long = pb.GenerateRequest(
        prompt="the owner's work", max_new_tokens=200, ignore_eos=True, request_id="order-42"
    )
    probe = pb.GenerateRequest(prompt="probe", max_new_tokens=1, request_id="order-42")
    with channel(stack, certs, certs.tenant_a) as a, channel(stack, certs, certs.tenant_b) as b:
        owner = generation_pb2_grpc.TextGenerationStub(a).GenerateStream(long, timeout=30)
        assert next(owner).request_id == "order-42"  # in flight now
        # another tenant can neither tell that the id is in flight nor squat it
        other = generation_pb2_grpc.TextGenerationStub(b).Generate(probe, timeout=30)
        assert other.request_id == "order-42"
        with pytest.raises(grpc.RpcError) as raised:
            generation_pb2_grpc.TextGenerationStub(a).Generate(probe, timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == "request_id: 'order-42' is in flight"
        owner.cancel()


def test_ambiguous_identities_are_unauthenticated(stack, certs: CertSet) -> None:
    twice = {"metadata": (("authorization", "Bearer token-of-c"), ("authorization", "Bearer x"))}
    with channel(stack, certs, certs.two_names) as two_names:
        with pytest.raises(grpc.RpcError) as raised:
            generate_or_raise(two_names)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert raised.value.details() == (
            "client certificate: its subject has more than one common name"
        )
    with channel(stack, certs, certs.tenant_a) as chan:
        with pytest.raises(grpc.RpcError) as raised:
            generate_or_raise(chan, **twice)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert raised.value.details() == "authorization: sent more than once (one token a call)"


def generate_or_raise(chan: grpc.Channel, **call: object) -> pb.GenerateResponse:
    request = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]), max_new_tokens=1)
    return generation_pb2_grpc.TextGenerationStub(chan).Generate(request, timeout=30, **call)


def test_tokenize_needs_a_tenant_and_model_info_stays_open(stack, certs: CertSet) -> None:
    tokenize = pb.TokenizeRequest(text="hello")
    with channel(stack, certs, certs.tenant_a) as chan:
        stub = generation_pb2_grpc.TextGenerationStub(chan)
        assert stub.Tokenize(tokenize, timeout=30).token_ids
        assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).block_size == 16
        with pytest.raises(grpc.RpcError) as raised:
            stub.Tokenize(tokenize, timeout=30, **bearer("secret-guess"))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED

"""The public port of a real stack started with mTLS (``--tls-cert``, ``--tls-key``,
``--tls-client-ca``): clients with a certificate of the CA are served, clients without one, with
one of another CA, or in plaintext are refused; the launcher still sees its frontend healthy
(over the frontend's private health address). Plaintext mode: tests/e2e/test_generate.py; TLS
without client certificates: tests/frontend/test_tls.py."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from e2e.stack import running_stack
from tls_certs import CertSet, Pair, make_test_certs

from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.cli.main import main as zerolayer_main
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stack(certs: CertSet, tmp_path_factory: pytest.TempPathFactory):
    model_dir = ensure_dummy_model(cache_dir=tmp_path_factory.mktemp("cache"))
    with running_stack(
        model_dir,
        tmp_path_factory.mktemp("logs"),
        tls_cert=str(certs.server.cert),
        tls_key=str(certs.server.key),
        tls_client_ca=str(certs.ca),
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

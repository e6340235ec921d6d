"""The frontend's HTTP server (zerolayer.frontend.http_server): uvicorn on the caller's event
loop, HTTPS with the frontend's certificate, a taken port refused at once, and the combination
with --tls-client-ca refused."""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.request
from pathlib import Path

import pytest
from fastapi import FastAPI
from tls_certs import make_test_certs

from zerolayer.common.config import FrontendConfig
from zerolayer.common.setting import SettingError
from zerolayer.frontend.__main__ import http_server
from zerolayer.frontend.http_server import HttpServer, HttpServerConfig


def make_app() -> FastAPI:
    app = FastAPI()
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    return app


async def fetch(url: str, context: ssl.SSLContext | None = None) -> bytes:
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.read()

    return await asyncio.to_thread(get)


def test_serves_https_with_the_certificate_then_stops(tmp_path: Path) -> None:
    certs = make_test_certs(tmp_path)
    config = HttpServerConfig(
        "127.0.0.1:0", tls_cert=str(certs.server.cert), tls_key=str(certs.server.key)
    )

    async def scenario() -> bytes:
        server = HttpServer(config)
        await server.start(make_app())
        context = ssl.create_default_context(cafile=str(certs.ca))
        body = await fetch(f"https://127.0.0.1:{server.port}/health", context)
        port = server.port
        await server.stop()
        with pytest.raises(OSError):
            await fetch(f"https://127.0.0.1:{port}/health", context)
        return body

    assert asyncio.run(scenario()) == b'{"status":"ok"}'


def test_a_taken_port_is_a_setting_error_before_serving() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingError) as refused:
            HttpServer(HttpServerConfig(f"127.0.0.1:{port}"))
    assert str(refused.value).startswith(f"--http-listen: 127.0.0.1:{port}: cannot listen there")


def test_frontends_sharing_the_port_bind_it_with_reuse_port() -> None:
    first = HttpServer(HttpServerConfig("127.0.0.1:0", reuse_port=True))
    second = HttpServer(HttpServerConfig(f"127.0.0.1:{first.port}", reuse_port=True))
    assert second.port == first.port
    asyncio.run(first.stop())
    asyncio.run(second.stop())


def test_off_by_default_and_refused_with_client_certificates() -> None:
    base = {"loader_address": "x", "scheduler_address": "x"}
    assert http_server(FrontendConfig(**base)) is None
    config = FrontendConfig(**base, http_listen="127.0.0.1:1", tls_client_ca="/ca.pem")
    with pytest.raises(
        SettingError, match="^--http-listen: cannot be combined with --tls-client-ca"
    ):
        http_server(config)
